"""The over-budget CSV: metric values that are not sent as metrics (over the run's name budget, or of a key the
server refused) are held in the journal and sent once, at the end, as one CSV artifact of the run.

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
from .journal import DELIVERED, REJECTED, Journal
from .server_answers import http_status, is_permanent

HELD = "over_budget"  # values kept for the over-budget CSV, sent once at the end
HELD_PAGE = 1000  # held entries read (and acknowledged) at a time to build that CSV


class OverBudgetCsv:
    """The held values of one journal, and the CSV artifact they end in."""

    def __init__(self, journal: Journal, client: Any, journal_id: str) -> None:
        self.journal = journal
        self.client = client
        self.path = f"hvd_mlflow/metrics-over-budget-{journal_id[:12]}.csv"  # in the run's artifacts

    def hold(self, records: Iterable[EpochRecord]) -> None:
        """Keep values that are not sent as metrics (over the budget, refused) for the CSV artifact."""
        for record in records:
            if record.metrics:
                self.journal.append(HELD, record.metrics, step=record.step, timestamp_ms=record.timestamp_ms)

    def waiting(self) -> bool:
        """Whether held values wait for the CSV."""
        return bool(self.journal.pending(1, kinds=(HELD,)))

    def send(self, run_id: str) -> None:
        """Every value held so far, once, in one CSV; its entries acknowledged (rejected, when refused for good)."""
        with (
            tempfile.TemporaryDirectory(prefix="hvd-mlflow-") as scratch,
            contextlib.closing(sqlite3.connect(Path(scratch) / "held.sqlite", isolation_level=None)) as rows,
        ):
            self._spill(rows)
            csv_path = Path(scratch) / PurePosixPath(self.path).name
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
        try:
            self.client.log_artifact(run_id, str(csv_path), str(PurePosixPath(self.path).parent))
        except Exception as error:
            if http_status(error) == 409:  # AzureML cannot overwrite: a 409 after a resend means it was applied
                return DELIVERED, None
            if not is_permanent(error):
                raise
            message = " ".join(redact(str(error)).split())[:300]
            logger.warning("hvd-mlflow: the tracking server refused the artifact %s (%s); its values stay in journal "
                           "%s, marked rejected", self.path, message, self.journal.location)  # fmt: skip
            return REJECTED, f"the artifact {self.path}: {message}"
        return DELIVERED, None
