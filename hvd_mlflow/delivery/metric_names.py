"""Which metric names a journal's values are sent under: the run's name budget (AzureML keeps 50 names per run;
:mod:`hvd_mlflow.delivery.metric_budget` ranks them), settled at the first epoch end, and the keys the server
refused. The values of the other names are held in the journal for the over-budget CSV, once per journal entry and
key, and one warning names them; they are sent once, at the end, as one CSV artifact of the run.

The held entries are read a page at a time into a temporary SQLite file, which drops the repeats a retry may have
held and sorts them by name and step, so memory stays bounded however many values were held.

Used on rank 0's sender thread and by the command line (``hvd-mlflow sync``), never on the training thread.
"""

from __future__ import annotations

import contextlib
import csv
import sqlite3
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from .._log import logger
from ..common.redact import redact
from .batching import EpochRecord
from .journal import DELIVERED, REJECTED, Entry, Journal
from .limits import Limits
from .metric_budget import BATCH_PREFIX, MetricBudget, run_names
from .mlflow_calls import user_metric_names
from .run_lifecycle import RunLifecycle
from .server_answers import applied_once, is_permanent

Point = tuple[str, float, int, int]  # key, value, timestamp_ms, step
HELD = "over_budget"  # values kept for the over-budget CSV, sent once at the end
HELD_PAGE = 1000  # held entries read (and acknowledged) at a time to build that CSV


class MetricNames:
    """The names sent as metrics, and the values held for the CSV instead, and the CSV artifact they end in."""

    def __init__(self, journal: Journal, client: Any, run: RunLifecycle, limits: Limits) -> None:
        self.journal = journal
        self.client = client
        self.run = run
        self.limits = limits
        self.csv_path = f"hvd_mlflow/metrics-over-budget-{run.meta.journal_id[:12]}.csv"  # in the run's artifacts
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
        if final or any(not k.startswith(BATCH_PREFIX) for e in metrics for k in e.payload):
            existing = self.run.contents.last_steps if self.run.contents else ()  # its keys
            limit = self.limits.metric_names_per_run
            shared = run_names(self.run.run_id, limit)  # the user's own calls on rank 0 check the same record
            # what the user logs with mlflow.log_metric (rank 0; none in hvd-mlflow sync, where no guard notes them)
            self.budget = MetricBudget(limit, existing, user_metric_names(self.run.run_id), names=shared)
            self.budget.settle(k for e in metrics for k in e.payload)
            self.warn_over_budget()
        return self.budget or MetricBudget(0)  # not settled: the metrics wait

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
            self.csv_path,
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
        self._hold(held)
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
            self.csv_path,
        )
        self._hold(EpochRecord(step, timestamp, {key: value}) for _key, value, timestamp, step in points)

    def forget(self, seqs: Iterable[int]) -> None:
        """The entries ``seqs`` are settled in the journal: which of their keys were held is not needed any more."""
        for seq in seqs:
            self.held.pop(seq, None)

    def _hold(self, records: Iterable[EpochRecord]) -> None:
        """Keep values that are not sent as metrics (over the budget, refused) for the CSV artifact."""
        for record in records:
            if record.metrics:
                self.journal.append(HELD, record.metrics, step=record.step, timestamp_ms=record.timestamp_ms)

    def held_waiting(self) -> bool:
        """Whether held values wait for the CSV."""
        return bool(self.journal.pending(1, kinds=(HELD,)))

    def send_held(self, run_id: str) -> None:
        """The over-budget CSV: every value that was not sent as a metric, once, at the end, in one CSV; its entries
        acknowledged (rejected, when refused for good)."""
        if not self.held_waiting():
            return
        self.warn_over_budget()
        with (
            tempfile.TemporaryDirectory(prefix="hvd-mlflow-") as scratch,
            contextlib.closing(sqlite3.connect(Path(scratch) / "held.sqlite", isolation_level=None)) as rows,
        ):
            self._spill(rows)
            csv_path = Path(scratch) / PurePosixPath(self.csv_path).name
            with csv_path.open("w", newline="") as out:
                writer = csv.writer(out)
                writer.writerow(["name", "step", "timestamp_ms", "value"])
                writer.writerows(rows.execute("SELECT name, step, timestamp_ms, value FROM held ORDER BY name, "
                                              "COALESCE(step, 0), COALESCE(timestamp_ms, 0), rowid"))  # fmt: skip
            state, reason = self._upload(run_id, csv_path)
            seqs = rows.execute("SELECT seq FROM seqs ORDER BY seq")
            while page := [seq for (seq,) in seqs.fetchmany(HELD_PAGE)]:
                self.journal.acknowledge(page, state=state, reason=reason)

    def _spill(self, rows: sqlite3.Connection) -> None:
        rows.execute("CREATE TABLE held (name TEXT, step INTEGER, timestamp_ms INTEGER, value TEXT, "
                     "UNIQUE (name, step, timestamp_ms, value))")  # fmt: skip
        rows.execute("CREATE TABLE seqs (seq INTEGER PRIMARY KEY)")
        after = 0
        while page := self.journal.pending(HELD_PAGE, kinds=(HELD,), after=after):
            values = [(k, e.step, e.timestamp_ms, str(v)) for e in page for k, v in e.payload.items()]
            rows.execute("BEGIN")
            rows.executemany("INSERT OR IGNORE INTO held VALUES (?, ?, ?, ?)", values)
            rows.executemany("INSERT INTO seqs VALUES (?)", [(e.seq,) for e in page])
            rows.execute("COMMIT")
            after = page[-1].seq

    def _upload(self, run_id: str, csv_path: Path) -> tuple[int, str | None]:
        """Upload the CSV; the state its entries take (rejected, with the reason, when refused for good)."""
        try:  # AzureML cannot overwrite: a 409 after a resend means it was applied
            applied_once(lambda: self.client.log_artifact(run_id, str(csv_path), "hvd_mlflow"))  # csv_path's folder
        except Exception as error:
            if not is_permanent(error):
                raise
            message = " ".join(redact(str(error)).split())[:300]
            logger.warning("hvd-mlflow: the tracking server refused the artifact %s (%s); its values stay in journal "
                           "%s, marked rejected", self.csv_path, message, self.journal.location)  # fmt: skip
            return REJECTED, f"the artifact {self.csv_path}: {message}"
        return DELIVERED, None
