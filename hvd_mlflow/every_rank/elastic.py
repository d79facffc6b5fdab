"""Horovod elastic training: one run, steps at the elastic state's epoch, nothing lost across resets.

With ``hvd.elastic.run``, a reset (a process died, hosts changed) re-runs ``fit`` in the surviving processes;
Keras' epoch counter restarts at 0 while the elastic state's ``epoch`` carries on, and the process that was
rank 0 may be gone, or may now be another rank. hvd-mlflow keeps, on the elastic state object of every process
(a plain attribute, never synchronised nor committed), an :class:`ElasticLink`: the run id and whether
hvd-mlflow created it (learned from rank 0 at train begin), and the global values of recent epochs (every rank
computed them). At a reset:

* every process stops its sender at once, without waiting for delivery (the journal keeps what it did not send,
  marked as handed over, so ``sync`` never ends the run);
* steps are ``state.epoch`` at the restart + Keras' epoch, so the curve continues where it was;
* whoever is rank 0 now logs into the same run (and ends it if hvd-mlflow created it), logs the params and the hosts
  tag again (every process keeps rank 0's of the first fit, agreed at its train begin: the same values, a no-op
  where they had arrived, and there where the old rank 0 died before sending them), and replays the recent epochs:
  those already delivered are skipped by the uploader's resume rule (a point at or below its metric's last logged
  step is not sent again), the others are sent. No epoch that the survivors completed is lost, none
  is logged twice.

:class:`ElasticSession` is the callback's side of it; the state is found from Horovod's
``UpdateEpochStateCallback`` in ``fit``'s callbacks (``autolog()``), or given as
``HorovodMlflowCallback(elastic_state=state)``.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

_ATTRIBUTE = "_hvd_mlflow_link"
HISTORY_EPOCHS = 1000  # recent epochs kept for a replay after a reset (100 metrics each: ~1 MB)
HISTORY_BATCHES = 20_000  # recent logged batches kept for it (a few metrics each: a few MB)
_RESET_ERRORS = ("HorovodInternalError", "HostsUpdatedInterrupt")
# What Horovod's own ``horovod.tensorflow.elastic.run`` treats as a reset when TensorFlow raises it: an
# ``UnknownError`` from one of Horovod's collective ops (a peer died inside ``fit``).
_RESET_OPS = ("HorovodAllreduce", "HorovodAllgather", "HorovodBroadcast")


@dataclasses.dataclass
class ElasticLink:
    """What every process keeps across resets."""

    run_id: str | None = None
    owns_run: bool = False  # hvd-mlflow created the run, so whoever is rank 0 at the end ends it
    params_logged: bool = False
    # the run's params and hosts tag: rank 0's of the first fit, agreed at its train begin (every_rank/fit_plan.py)
    params: tuple[dict[str, str], dict[str, str]] | None = None
    history: collections.OrderedDict[int, tuple[int, dict[str, float]]] = dataclasses.field(
        default_factory=collections.OrderedDict
    )  # step -> (timestamp_ms, logged values)

    batch_history: collections.deque[tuple[int, int, dict[str, float]]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=HISTORY_BATCHES)
    )  # (step, timestamp_ms, logged values) of recent logged batches

    def remember(self, step: int, timestamp_ms: int, values: Mapping[str, float]) -> None:
        """An epoch's logged values (the extras included: every rank computes them)."""
        self.history[step] = (timestamp_ms, dict(values))
        while len(self.history) > HISTORY_EPOCHS:
            self.history.popitem(last=False)

    def remember_batch(self, step: int, timestamp_ms: int, values: Mapping[str, float]) -> None:
        """A logged batch's global values (``batch/...``)."""
        self.batch_history.append((step, timestamp_ms, dict(values)))


def link(state: Any) -> ElasticLink:
    """The link kept on ``state`` (created on first use)."""
    found = getattr(state, _ATTRIBUTE, None)
    if found is None:
        found = ElasticLink()
        object.__setattr__(state, _ATTRIBUTE, found)
    return found


class ElasticSession:
    """One callback's view of an elastic training: restarts, steps, the run across resets, the replay."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.link = link(state)
        self._offset: int | None = None

    def fit_begins(self) -> None:
        """Called at train begin: the step offset is measured again at the first epoch."""
        self._offset = None

    def step(self, epoch: int) -> int:
        """The run's step of Keras' ``epoch``: the state's epoch when this ``fit`` began, plus Keras' count."""
        if self._offset is None:
            self._offset = int(self.state.epoch) - epoch
        return epoch + self._offset

    def agreed_params(self, params: Mapping[str, str] | None, tags: Mapping[str, str]) -> None:
        """Keep the run's params agreed at train begin (the first fit's; later fits' agreements carry the same)."""
        if self.link.params is None and params is not None:
            self.link.params = (dict(params), dict(tags))

    def agreed_run(self, run_id: str | None, owns_run: bool) -> None:
        self.link.run_id = run_id or self.link.run_id
        self.link.owns_run = owns_run or self.link.owns_run

    def replay(self) -> Iterator[tuple[int, int, dict[str, float]]]:
        """The recent logged batches and epochs, for a new rank 0 to send again (the resume rule drops what the
        run holds): ``(step, timestamp_ms, values)``."""
        yield from list(self.link.batch_history)
        for step, (timestamp_ms, values) in list(self.link.history.items()):
            yield step, timestamp_ms, values


def state_from_callbacks(callbacks: Iterable[Any]) -> Any | None:
    """The elastic state of Horovod's ``UpdateEpochStateCallback`` among ``callbacks``, if any."""
    for callback in callbacks:
        if "UpdateEpochStateCallback" in type(callback).__name__ and hasattr(callback, "state"):
            return callback.state
    return None


def is_reset(error: BaseException) -> bool:
    """Whether ``error`` is an elastic reset (``fit`` will run again), not a failure: Horovod's own signals, or a
    TensorFlow ``UnknownError`` raised by one of Horovod's collectives, which Horovod's elastic ``run`` turns into
    a reset too."""
    name = type(error).__name__
    if name in _RESET_ERRORS:
        return True
    message = str(getattr(error, "message", "") or error)
    return name == "UnknownError" and any(op in message for op in _RESET_OPS)
