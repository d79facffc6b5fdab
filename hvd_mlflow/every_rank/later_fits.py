"""Where a later ``fit`` of this process logs, when it logs into a run that an earlier ``fit`` of this process logged
into: right after it, so that every fit keeps its epochs, on distinct steps, in order.

Keras numbers a fit's epochs from ``initial_epoch`` (0 unless given) and its optimizer's steps from the optimizer's
own count (0 again after ``compile``). Keras' transfer-learning recipe trains a new head, unfreezes the base,
compiles again and calls ``fit`` a second time without ``initial_epoch``: its epochs would be logged at steps 0, 1 ...
again, where the first fit's are, and its batch curves likewise. So rank 0 remembers, per run, the last epoch step and
the last global batch step this process reached in it (:func:`remember`), and a later fit into the same run is moved
to start just after them (:class:`Offsets`): its first epoch at ``last epoch + 1`` when it would start at or below
it, its batch steps after the last batch step. A fit that already continues (``initial_epoch`` past the last epoch,
an optimizer that kept counting) is not moved. The tag :data:`FIT_STARTS_TAG` says at which step each fit of the
process began, once a run holds more than one.

What the run held before this process started (a restarted job, ``BackupAndRestore``) is not moved: that is
``resume="skip"``'s work (:mod:`hvd_mlflow.delivery.uploader`, and :mod:`hvd_mlflow.delivery.params_tags` for
params), which sends an epoch repeated after a restart once.
Horovod elastic numbers its steps from its own state (:mod:`hvd_mlflow.every_rank.elastic`): not moved either.

Rule 2: what rank 0 remembers reaches the other ranks in the train-begin agreement
(:mod:`hvd_mlflow.every_rank.fit_plan`), so every rank moves its steps alike.

Example::

    remember("run-a", last_epoch=2, last_batch=30)
    offsets = Offsets.after(recalled("run-a"), first_step=0)
    offsets.epoch(0, first_epoch=0), offsets.batch(10)  # (3, 40): the second fit's first epoch, and its batch step 10
"""

from __future__ import annotations

import dataclasses
import threading

FIT_STARTS_TAG = "hvd_mlflow.fit_starts"  # the first epoch step of each fit this process logged into the run


@dataclasses.dataclass(frozen=True)
class Logged:
    """What this process logged into one run: its last epoch step, its last global batch step (``None``: no batch
    hooks counted), and the first epoch step of each of its fits there."""

    last_epoch: int
    last_batch: int | None = None
    fit_starts: tuple[int, ...] = ()


_logged: dict[str, Logged] = {}
_lock = threading.Lock()


def recalled(run_id: str | None) -> Logged | None:
    """What this process logged into ``run_id`` before (rank 0), or ``None``."""
    with _lock:
        return _logged.get(run_id) if run_id else None


def remember(run_id: str | None, last_epoch: int, last_batch: int | None, first_epoch: int | None = None) -> None:
    """Rank 0, as a fit journals its epochs: the last steps it reached in ``run_id`` (never lowered), and the step its
    fit began at."""
    if not run_id:
        return
    with _lock:
        before = _logged.get(run_id, Logged(last_epoch))
        starts = before.fit_starts
        if first_epoch is not None and first_epoch not in starts:
            starts = (*starts, first_epoch)
        batches = [b for b in (before.last_batch, last_batch) if b is not None]
        _logged[run_id] = Logged(max(before.last_epoch, last_epoch), max(batches) if batches else None, starts)


@dataclasses.dataclass(frozen=True)
class Offsets:
    """How far this fit's steps are moved (agreed: computed on every rank from the agreed plan and what Keras passes
    to every rank alike)."""

    logged: Logged | None = None  # what rank 0's process had logged into the run before this fit
    batch_offset: int = 0

    @classmethod
    def after(cls, logged: Logged | None, first_step: int) -> Offsets:
        """The offsets of a fit whose optimizer starts at the global step ``first_step``."""
        if logged is None or logged.last_batch is None:
            return cls(logged)
        return cls(logged, max(0, logged.last_batch - first_step))

    @property
    def later_fit(self) -> bool:
        return self.logged is not None

    def epoch(self, epoch: int, first_epoch: int) -> int:
        """The step of Keras' ``epoch`` in a fit whose first epoch is ``first_epoch``."""
        if self.logged is None:
            return epoch
        return epoch + max(0, self.logged.last_epoch + 1 - first_epoch)

    def batch(self, step: int) -> int:
        """The step at which the batch-clock's global ``step`` is logged."""
        return step + self.batch_offset
