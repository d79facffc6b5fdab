"""The metric-name budget of a run: which names are logged as metrics when the server keeps only so many.

AzureML keeps at most 50 metric names per run and silently drops the others from Studio. A realistic training
passes 50 easily (15 compiled metrics and their ``val_`` twins, hvd-mlflow's own per-epoch values, the rank spread,
per-batch curves). So the names are ranked, and the budget goes to them in this order:

1. the Keras epoch metrics (``loss``, ``accuracy``, ...);
2. their ``val_`` twins;
3. the names the user logs with ``mlflow.log_metric`` (those known when the budget is settled);
4. hvd-mlflow's per-epoch values (``learning_rate``, ``epoch_time_s``, ``samples_per_s``);
5. the rank spread (``<key>_rank_min`` / ``_rank_max``);
6. the per-batch curves (``batch/<key>``);
7. the per-rank health (``system/...``).

Names the run already holds count first (they are there for good). The budget is settled once, at the first
epoch end (the first journal entry with epoch values), by whoever uploads the journal (rank 0's sender, or
``hvd-mlflow sync``); a name first seen later gets a place while one is left. A name that does not fit is not sent
as a metric: its values go to a CSV artifact, and one warning names them all.

The user may log names of their own later (a callback's score, a test score after ``fit``): hvd-mlflow's optional
names (rank spread, batch curves, system metrics) never take the last tenth of the places, less the user's names
already known. And the run never passes its limit whoever logs:
:class:`RunNames` is this process's one record of the names a run holds, shared by the sender's budget and the
user's own calls on rank 0 (:mod:`hvd_mlflow.delivery.mlflow_calls`), which admit a new user name only while a place
is left (else its values go to a CSV artifact too).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

# what hvd-mlflow adds to every epoch, and the divergence check's metric
EXTRAS = ("learning_rate", "epoch_time_s", "samples_per_s", "weights_rank_spread")
SPREAD_SUFFIXES = ("_rank_min", "_rank_max")
BATCH_PREFIX = "batch/"
SYSTEM_PREFIX = "system/"
KERAS, VAL, USER, OURS, SPREAD, BATCH, SYSTEM = range(7)


def rank_of(name: str, user_names: Iterable[str] = ()) -> int:
    """Where ``name`` stands in the priority order above (lower first)."""
    if name in set(user_names):
        return USER
    if name.startswith(BATCH_PREFIX):
        return BATCH
    if name.startswith(SYSTEM_PREFIX):
        return SYSTEM
    if name.endswith(SPREAD_SUFFIXES):
        return SPREAD
    if name in EXTRAS:
        return OURS
    if name.startswith("val_"):
        return VAL
    return KERAS


class RunNames:
    """The metric names one run holds, as this process knows them (what the run held when read, what the budget
    admitted, the names the user's own calls sent), within ``limit``: the sender's thread and the user's thread (rank
    0) both add to it, under one lock.

    Example::

        names = run_names("run-1", limit=2)
        names.admit("loss"), names.admit("user_score"), names.admit("third")  # True, True, False
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.names: set[str] = set()
        self.lock = threading.RLock()

    def admit(self, name: str, keep_free: int = 0) -> bool:
        """Whether ``name`` is (or now becomes) one of the run's names, ``keep_free`` places left over."""
        with self.lock:
            if name in self.names:
                return True
            if self.limit is None or len(self.names) + keep_free < self.limit:
                self.names.add(name)
                return True
            return False


_runs: dict[str, RunNames] = {}
_runs_lock = threading.Lock()


def run_names(run_id: str | None, limit: int | None) -> RunNames:
    """This process's record of ``run_id``'s names (a new one per call when the run is not known yet)."""
    if not run_id:
        return RunNames(limit)
    with _runs_lock:
        found = _runs.setdefault(run_id, RunNames(limit))
        found.limit = limit
        return found


def known_run(run_id: str | None) -> RunNames | None:
    """The record of a run hvd-mlflow logs (or logged) into from this process, if any: the user's calls check it."""
    with _runs_lock:
        return _runs.get(run_id) if run_id else None


class MetricBudget:
    """Which metric names one run logs, within ``limit`` names (``None``: no limit).

    Example::

        budget = MetricBudget(limit=3, existing={"user_metric"})
        budget.settle(["loss", "val_loss", "learning_rate", "batch/loss"])
        budget.admits("loss"), budget.admits("batch/loss")  # True, False
        budget.over  # ['learning_rate', 'batch/loss']
    """

    def __init__(
        self,
        limit: int | None,
        existing: Iterable[str] = (),
        user_names: Iterable[str] = (),
        names: RunNames | None = None,
    ) -> None:
        self.limit = limit
        self._user = set(user_names)
        # shared with the user's calls (rank 0): run_names(run_id, limit), which sets its limit
        self._names = names if names is not None else RunNames(limit)
        with self._names.lock:
            self._names.names.update(set(existing) | self._user)  # the run holds them, or the user logs them
        # places hvd-mlflow's optional names leave free for the names the user logs later: a tenth of the limit
        self._reserve = max(0, (limit or 0) // 10 - len(self._user))
        self.over: list[str] = []
        self.settled = limit is None  # else at settle()

    def settle(self, names: Iterable[str]) -> None:
        """Give the room left to ``names`` in priority order (stable within a rank of the order). A ``batch/<key>``
        seen before the first epoch values also keeps a place for ``<key>``: it comes with every epoch."""
        names = list(dict.fromkeys(names))
        epoch_keys = [n[len(BATCH_PREFIX) :] for n in names if n.startswith(BATCH_PREFIX)]
        for name in sorted(dict.fromkeys([*names, *epoch_keys]), key=lambda n: rank_of(n, self._user)):
            self._place(name)
        self.settled = True

    def admits(self, name: str) -> bool:
        """Whether ``name`` is logged as a metric (placing a name not seen yet, while room is left)."""
        if self.limit is None or name in self._names.names:
            return True
        self._place(name)
        return name in self._names.names

    def _place(self, name: str) -> None:
        if name in self._names.names or name in self.over:
            return
        optional = rank_of(name, self._user) in (SPREAD, BATCH, SYSTEM)
        if not self._names.admit(name, keep_free=self._reserve if optional else 0):
            self.over.append(name)
