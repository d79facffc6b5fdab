"""Which metric names a journal's values are sent under: the run's name budget (AzureML keeps 50 names per run;
:mod:`hvd_mlflow.delivery.metric_budget` ranks them), settled at the first epoch end, and the keys the server
refused. The values of the other names are held for the over-budget CSV
(:mod:`hvd_mlflow.delivery.over_budget_csv`), once per journal entry and key, and one warning names them.

Used on rank 0's sender thread and by the command line (``hvd-mlflow sync``), never on the training thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .._log import logger
from ..common.redact import redact
from .batching import EpochRecord
from .journal import Entry, Journal
from .limits import Limits
from .metric_budget import MetricBudget, is_epoch_name, run_names
from .over_budget_csv import OverBudgetCsv
from .run_lifecycle import RunLifecycle

Point = tuple[str, float, int, int]  # key, value, timestamp_ms, step


class MetricNames:
    """The names sent as metrics, and the values held for the CSV instead."""

    def __init__(
        self,
        journal: Journal,
        run: RunLifecycle,
        limits: Limits,
        csv: OverBudgetCsv,
        user_metric_names: Callable[[str | None], Iterable[str]],
    ) -> None:
        self.journal = journal
        self.run = run
        self.limits = limits
        self.csv = csv
        self._user_metric_names = user_metric_names  # what the user logs with mlflow.log_metric (rank 0)
        self.budget: MetricBudget | None = None
        self.refused: dict[str, str] = {}  # metric keys the server refused -> its message
        # journal entry -> its keys whose values are held for the CSV: kept until the entry is acknowledged (a
        # retry of a pending entry must not hold them twice), so it is bounded by the entries pending
        self.held: dict[int, set[str]] = {}
        self._over_warned: set[str] = set()
        self.final = False  # nothing more will be journaled: settle what waits for the first epoch

    def budget_for(self, entries: list[Entry], window_full: bool) -> MetricBudget:
        """The budget, settled at the first entry with epoch values (or at the end, when none will come).
        ``window_full``: ``entries`` filled the uploader's read-ahead window."""
        if self.budget is not None and self.budget.settled:
            return self.budget
        if self.limits.metric_names_per_run is None:  # no budget: nothing waits
            self.budget = MetricBudget(None)
            return self.budget
        metrics = [e for e in entries if e.kind == "metrics"]
        # settle at the first epoch values; or now when none can come before the others are sent: the training's
        # outcome is known (sync, the end of fit), or the read-ahead window is all batch values
        final = self.final or bool(self.journal.meta().final_status) or window_full
        if final or any(is_epoch_name(k) for e in metrics for k in e.payload):
            existing = self.run.contents.metric_names if self.run.contents else set()
            limit = self.limits.metric_names_per_run
            shared = run_names(self.run.run_id, limit)  # the user's own calls on rank 0 check the same record
            self.budget = MetricBudget(limit, existing, self._user_metric_names(self.run.run_id), names=shared)
            self.budget.settle(k for e in metrics for k in e.payload)
            self.warn_over_budget()
        return self.budget or MetricBudget(0, settled=False)

    def warn_over_budget(self) -> None:
        if self.budget is None:
            return
        new = [n for n in self.budget.over if n not in self._over_warned]
        if not new:
            return
        self._over_warned.update(new)
        logger.warning(
            "hvd-mlflow: this run keeps at most %d metric names (%s); %d are not logged as metrics: %s. Their values "
            "are kept in the artifact %s. Names are chosen in this order: Keras epoch metrics, their val_ twins, "
            "your own mlflow.log_metric names, hvd-mlflow's learning_rate/epoch_time_s/samples_per_s, rank_spread, "
            "batch/ curves; log fewer (rank_spread, log_every_n_steps) or set max_metric_names.",
            self.budget.limit,
            "AzureML's limit" if self.limits.metric_names_per_run == 50 else "max_metric_names",
            len(new),
            ", ".join(new[:12]) + (", ..." if len(new) > 12 else ""),
            self.csv.path,
        )

    def split(self, records: list[EpochRecord], seqs: list[int]) -> list[EpochRecord]:
        """Each record's values without those not sent as metrics (over the budget, refused keys), which are held
        for the CSV, once per journal entry and key."""
        assert self.budget is not None
        sent, held = [], []
        for record, seq in zip(records, seqs, strict=True):
            ok = {k: v for k, v in record.metrics.items() if k not in self.refused and self.budget.admits(k)}
            sent.append(EpochRecord(record.step, record.timestamp_ms, ok))
            done = self.held.get(seq, set())
            rest = {k: v for k, v in record.metrics.items() if k not in ok and k not in done}
            if rest:
                self.held[seq] = done | set(rest)
            held.append(EpochRecord(record.step, record.timestamp_ms, rest))
        self.csv.hold(held)
        self.warn_over_budget()
        return sent

    def refuse(self, key: str, error: BaseException, points: list[Point]) -> None:
        """The server refused ``key``: it is not sent again, and its values are held for the CSV."""
        message = redact(str(error))[:300]
        self.refused[key] = message
        logger.warning(
            "hvd-mlflow: the tracking server refused metric %r (%s); it is not sent again, and its values are kept "
            "in the artifact %s",
            key,
            message,
            self.csv.path,
        )
        self.csv.hold(EpochRecord(step, timestamp, {key: value}) for _key, value, timestamp, step in points)

    def forget(self, seqs: Iterable[int]) -> None:
        """The entries ``seqs`` are settled in the journal: which of their keys were held is not needed any more."""
        for seq in seqs:
            self.held.pop(seq, None)

    def send_held(self, run_id: str) -> None:
        """The over-budget CSV: every value that was not sent as a metric, once, at the end."""
        if not self.csv.waiting():
            return
        self.warn_over_budget()
        self.csv.send(run_id)
