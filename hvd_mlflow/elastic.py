"""Horovod elastic training: one run, steps at the elastic state's epoch, nothing lost across resets.

With ``hvd.elastic.run``, a reset (a process died, hosts changed) re-runs ``fit`` in the surviving processes;
Keras' epoch counter restarts at 0 while the elastic state's ``epoch`` carries on, and the process that was
rank 0 may be gone. hvd-mlflow keeps, on the elastic state object of every process (a plain attribute, never
synchronised nor committed), an :class:`ElasticLink`: the run id and whether hvd-mlflow created it (learned
from rank 0's broadcast), and the global values of recent epochs (every rank computed them). After a reset:

* steps are ``state.epoch`` at train begin + Keras' epoch, so the curve continues where it was;
* the new rank 0 logs into the same run (and ends it if hvd-mlflow created it), and replays the recent
  epochs: those the old rank 0 had delivered are skipped by the uploader's resume rule (a point at or below
  its metric's last logged step is not sent again), those it had not are sent. No epoch that the survivors
  completed is lost, none is logged twice.

The state is found from Horovod's ``UpdateEpochStateCallback`` in ``fit``'s callbacks (``autolog()``), or given
as ``HorovodMlflowCallback(elastic_state=state)``.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

_ATTRIBUTE = "_hvd_mlflow_link"
HISTORY_EPOCHS = 1000  # recent epochs kept for a replay after a reset (100 metrics each: ~1 MB)
_RESET_ERRORS = ("HorovodInternalError", "HostsUpdatedInterrupt")


@dataclasses.dataclass
class ElasticLink:
    """What every process keeps across resets."""

    run_id: str | None = None
    owns_run: bool = False  # hvd-mlflow created the run, so whoever is rank 0 at the end ends it
    params_logged: bool = False
    history: collections.OrderedDict[int, tuple[int, dict[str, float]]] = dataclasses.field(
        default_factory=collections.OrderedDict
    )  # step -> (timestamp_ms, logged values)

    def remember(self, step: int, timestamp_ms: int, values: Mapping[str, float]) -> None:
        self.history[step] = (timestamp_ms, dict(values))
        while len(self.history) > HISTORY_EPOCHS:
            self.history.popitem(last=False)


def link(state: Any) -> ElasticLink:
    """The link kept on ``state`` (created on first use)."""
    found = getattr(state, _ATTRIBUTE, None)
    if found is None:
        found = ElasticLink()
        object.__setattr__(state, _ATTRIBUTE, found)
    return found


def state_from_callbacks(callbacks: Iterable[Any]) -> Any | None:
    """The elastic state of Horovod's ``UpdateEpochStateCallback`` among ``callbacks``, if any."""
    for callback in callbacks:
        if "UpdateEpochStateCallback" in type(callback).__name__ and hasattr(callback, "state"):
            return callback.state
    return None


def is_reset(error: BaseException) -> bool:
    """Whether ``error`` is Horovod's signal of an elastic reset (``fit`` will run again), not a failure."""
    return any(type(error).__name__ == name for name in _RESET_ERRORS)
