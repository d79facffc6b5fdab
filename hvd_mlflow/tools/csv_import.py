"""Bring a Keras ``CSVLogger`` file into an MLflow run: one point per column per epoch, at ``step = epoch``.

The points go through an in-memory journal and the same uploader as live training, so requests stay within
MLflow's and AzureML's limits and are retried the same way. Re-running adds nothing: the run is found again by
the file's checksum (a tag), and points already in the run are not sent.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

from ..common import compat
from ..delivery.journal import JournalMeta, MemoryJournal
from ..delivery.limits import for_tracking_uri
from ..delivery.uploader import JOURNAL_ID_TAG, Uploader
from ..every_rank.aggregate import scalar
from ..every_rank.names import NameMap


@dataclasses.dataclass(frozen=True)
class Imported:
    run_id: str
    sent: int
    already: int


def read_csv_logger(path: Path) -> list[dict[str, float]]:
    """Rows of a CSVLogger file as ``{"epoch": e, key: value, ...}``; empty and ``NA`` cells are left out.

    A file it cannot read (no ``epoch`` column, a row with more or fewer cells than the header, an epoch that is
    not a number, not CSV at all) raises a :class:`ValueError` naming the file and the row (the header is row 1).
    """
    with path.open(newline="") as handle:
        sample = handle.read(4096)
        handle.seek(0)
        reader = csv.reader(handle, dialect=_dialect(sample))
        try:
            header = next(reader, None)
            if not header or "epoch" not in header:
                raise ValueError(f"{path}: row 1: no 'epoch' column; is it a Keras CSVLogger file?")
            rows = [_row(path, reader.line_num, header, cells) for cells in reader if cells]
        except csv.Error as error:
            raise ValueError(f"{path}: row {reader.line_num}: not readable as CSV ({error})") from None
    return rows


def _dialect(sample: str) -> type[csv.Dialect] | csv.Dialect:
    """The file's delimiter as the sniffer finds it; a comma when it cannot tell (one column, a ragged file)."""
    try:
        return csv.Sniffer().sniff(sample, delimiters=",;\t") if sample else csv.excel
    except csv.Error:
        first = sample.splitlines()[0] if sample else ""
        for delimiter in ",;\t":  # the header's delimiter, when the sniffer was put off by a ragged row
            if delimiter in first:
                dialect = csv.excel()
                dialect.delimiter = delimiter
                return dialect
        return csv.excel


def _row(path: Path, line: int, header: list[str], cells: list[str]) -> dict[str, float]:
    if len(cells) != len(header):
        raise ValueError(f"{path}: row {line} has {len(cells)} fields, the header {len(header)}")
    raw = dict(zip(header, cells, strict=True))
    epoch = _number(raw["epoch"])
    if epoch is None:
        raise ValueError(f"{path}: row {line}: epoch {raw['epoch']!r} is not a number")
    row = {"epoch": int(epoch)}
    for key, text in raw.items():
        value = scalar(_number(text))
        if key != "epoch" and value is not None:
            row[key] = value
    return row


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "", "NA") else None
    except ValueError:
        return None


def import_csv(
    path: Path,
    *,
    run_id: str | None,
    experiment: str | None,
    tracking_uri: str | None,
    on_progress: Callable[[int, int], None] = lambda settled, total: None,
) -> Imported:
    import mlflow

    uri = tracking_uri or mlflow.get_tracking_uri()
    client = compat.command_line_client(uri)
    rows = read_csv_logger(path)
    checksum = hashlib.sha256(path.read_bytes()).hexdigest()
    journal = MemoryJournal(JournalMeta(
        tracking_uri=uri, run_id=run_id, experiment_name=experiment, journal_id=checksum,
        create_attempted=True,  # look for the run of an earlier import of the same file first
        run_tags={"hvd_mlflow.source": "import-csv", "hvd_mlflow.csv_file": path.name},
        final_status="FINISHED",
    ))  # fmt: skip
    uploader = Uploader(journal, client, for_tracking_uri(uri))
    run = uploader.run.ensure_run()
    names = NameMap(what="metric")(sorted({k for row in rows for k in row if k != "epoch"}))
    present = {name: {m.step for m in client.get_metric_history(run, name)} for name in names.values()}
    now = int(time.time() * 1000)
    sent = already = 0
    for row in rows:
        missing = {names[k]: v for k, v in row.items() if k != "epoch" and row["epoch"] not in present[names[k]]}
        already += len(row) - 1 - len(missing)
        if missing:
            journal.append("metrics", missing, step=row["epoch"], timestamp_ms=now + row["epoch"])
            sent += len(missing)
    total = journal.count()
    uploader.deliver(until_done=True, on_progress=lambda settled: on_progress(settled, total))
    if uploader.run.meta.created_run and not run_id:
        uploader.finish()
    journal.close()
    client.set_tag(run, JOURNAL_ID_TAG, checksum)
    return Imported(run, sent, already)
