"""When to log batch values (``log_every_n_steps``), decided the same way on every rank by construction.

The global step after a batch is the step this ``fit`` started from (rank 0's optimizer iteration count at train
begin, agreed by every rank: see :mod:`hvd_mlflow.every_rank.fit_plan`) plus the batches Keras ran since, counted from
the batch indices Keras passes to every rank alike, never from a rank's own optimizer (with Horovod's resume recipe
the ranks' iteration counts differ until the end of the first batch). At each epoch end the count is re-anchored on
rank 0's iteration count, carried in the epoch's collective, so that it never drifts from the optimizer's.

With ``steps_per_execution = k`` Keras calls the batch hooks once per k batches. Keras 3 passes the index of the
first batch of the execution (when the epoch's length is known), tf_keras and Keras 2 the last; the first call of
each epoch tells which (index 0 or k-1: the same on every rank). Values are reduced and logged after each
execution that reaches or crosses a multiple of N, at the global step it ended on (with N a multiple of k: exactly
at the multiples of N).
"""

from __future__ import annotations

STEPS_PER_BATCH_COLLECTIVE = 100  # logged batches wait for one collective per ~100 optimizer steps (or the epoch end)


def logged_batches_per_collective(every: int) -> int:
    """How many logged batches' values ride in one collective: about :data:`STEPS_PER_BATCH_COLLECTIVE` optimizer
    steps' worth (at least one). From the agreed interval ``every``, so the same on every rank."""
    return max(1, -(-STEPS_PER_BATCH_COLLECTIVE // every)) if every > 0 else 1


class BatchClock:
    """Counts a fit's batches and says after which ones to log, and at which global step.

    Example::

        clock = BatchClock(first_step=0, every=4, per_execution=1)
        clock.epoch_begins()
        [clock.after_batch(b) for b in range(6)]  # [None, None, None, 4, None, None]
    """

    def __init__(self, first_step: int, every: int, per_execution: int = 1) -> None:
        self.every = every
        self._per_execution = max(1, per_execution)
        self._anchor = first_step  # the global step at the start of the count
        self._before_epoch = 0  # batches since the anchor, in the epochs before this one
        self._in_epoch = 0
        self._index_is_first: bool | None = None  # learned at the epoch's first call

    def epoch_begins(self) -> None:
        self._before_epoch += self._in_epoch
        self._in_epoch = 0
        self._index_is_first = None

    def anchor(self, step: int) -> None:
        """Every rank agreed that the global step is ``step`` now (rank 0's optimizer, carried in a collective)."""
        self._anchor, self._before_epoch, self._in_epoch = step, 0, 0

    @property
    def step(self) -> int:
        """The global step now: the optimizer's iteration count, as every rank agrees on it."""
        return self._anchor + self._before_epoch + self._in_epoch

    def after_batch(self, batch: int) -> int | None:
        """Keras' ``batch`` index just ended: the global step to log at, or ``None``."""
        if self._index_is_first is None:
            self._index_is_first = self._per_execution > 1 and batch == 0
        done = batch + self._per_execution if self._index_is_first else batch + 1
        before = self.step
        self._in_epoch = max(self._in_epoch, done)
        now = self.step
        if self.every > 0 and now // self.every > before // self.every:
            return now
        return None
