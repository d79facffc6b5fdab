"""``hvd-mlflow sync``'s work, without the command line: which files are journals, the run's outcome, delivery
to the end, and what is left and why.

Only hvd-mlflow journals are ever opened for writing: each path is checked read-only first
(:func:`hvd_mlflow.delivery.journal.inspect`: the name, SQLite's header, the tables, a journal id), and a journal's
companions (its lock, SQLite's ``-wal``/``-shm``), as a shell glob over the journal folder gives them, stand for
their journal, which is synced once. Delivery is the live sender's own loop (:meth:`Uploader.deliver`), run
until nothing that can be sent is pending; entries the server refuses for good are kept in the journal, marked
rejected with the server's reason, and reported.

Example::

    for path in journal_paths([Path(".hvd_mlflow/journal/x.journal.sqlite")]):
        result = sync_one(path, tracking_uri=None, keep=False, force=False)
        report = result.summary(), result.problem()  # one line each: what went, what is left and why
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path

from .._log import logger
from ..common import compat
from ..common.redact import mask_uri
from ..delivery import destination
from ..delivery import journal as journal_module
from ..delivery.journal import Entry, FileJournal, JournalMeta

_REPORTED = 3  # refused entries named in the one-line report; the others are counted
_LIVE = "a training still sends from it (its process holds the journal; --force uploads)"


@dataclasses.dataclass
class Synced:
    """What one journal's sync did."""

    path: Path
    run_id: str | None = None
    uploaded: int = 0
    left: int = 0
    rejected: list[tuple[Entry, str]] = dataclasses.field(default_factory=list)
    rejected_count: int = 0
    skipped: str | None = None  # why it was not synced at all
    notes: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        if self.skipped:
            return f"{self.path}: skipped, {self.skipped}"
        refused = f", {self.rejected_count} refused by the server" if self.rejected_count else ""
        return f"{self.path}: {self.uploaded} entries uploaded to run {self.run_id}, {self.left} left{refused}"

    def problem(self) -> str | None:
        """One line saying what is left in the journal and why, or None when everything was delivered."""
        if self.skipped:
            return None
        parts = []
        if self.rejected_count:
            named = "; ".join(reason for _, reason in self.rejected[:_REPORTED])
            more = f"; and {self.rejected_count - _REPORTED} more" if self.rejected_count > _REPORTED else ""
            parts.append(
                f"{self.rejected_count} entr{'y' if self.rejected_count == 1 else 'ies'} refused for good by the "
                f"server, kept in the journal marked rejected (everything else was delivered): {named}{more}"
            )
        if self.left:
            parts.append(f"{self.left} entries still pending (the upload stopped before them): run sync again")
        return f"{self.path}: " + "; ".join(parts) if parts else None


def journal_paths(given: Iterable[Path]) -> list[Path]:
    """Each journal once, in the order given: a companion (``X.journal.sqlite.lock``, ``-wal``, ``-shm``) stands
    for its journal, and is dropped silently when that journal is not there."""
    out: list[Path] = []
    seen: set[Path] = set()
    for path in given:
        journal = journal_module.companion_of(path)
        if journal is not None and not journal.exists():
            continue
        path = journal or path
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


def sync_one(
    path: Path,
    tracking_uri: str | None,
    *,
    keep: bool,
    force: bool,
    on_progress: Callable[[int, int], None] = lambda settled, total: None,
) -> Synced:
    """Deliver one journal, saying ``on_progress(settled, total)`` as entries are settled (``settled``: since the
    last call);
    :class:`~hvd_mlflow.delivery.journal.NotAJournal` (the file untouched) when it is not one."""
    meta = journal_module.inspect(path)  # read-only: nothing but a journal is opened for writing
    if not force and journal_module.written_now(path, meta):  # a live writer's journal is not even opened
        return Synced(path, skipped=_LIVE)
    with contextlib.closing(FileJournal.open(path)) as journal:
        if not journal.take_over() and not force:  # it came alive meanwhile
            return Synced(path, skipped=_LIVE)
        from ..delivery.limits import for_tracking_uri
        from ..delivery.uploader import Uploader

        meta = journal.meta()
        # "": the training's MLflow default, which it had not resolved yet: MLflow's default in its working directory
        uri = tracking_uri or meta.tracking_uri or compat.default_tracking_uri(meta.working_directory)
        if not tracking_uri and meta.tracking_uri_has_credentials:
            uri = destination.tracking_uri_from_environment() or ""
            if not uri:
                raise ValueError(f"{path}: its tracking URI carried credentials, which journals never store; give "
                                 "it with --tracking-uri or MLFLOW_TRACKING_URI")  # fmt: skip
        client = compat.command_line_client(uri)
        result = Synced(path)
        _settle_outcome(journal, meta, client, result)
        uploader = Uploader(journal, client, for_tracking_uri(uri))
        total, rejected_before = journal.count(), journal.count(journal_module.REJECTED)
        logger.info("hvd-mlflow: %s: %d entries to send to %s, run %s", path, total, mask_uri(uri),
                    meta.run_id or "not created yet")  # fmt: skip
        uploader.deliver(until_done=True, on_progress=lambda settled: on_progress(settled, total))
        uploader.finish()
        result.run_id = uploader.run_id
        result.left = journal.count()
        result.rejected_count = journal.count(journal_module.REJECTED)
        result.uploaded = total - result.left - (result.rejected_count - rejected_before)
        result.rejected = journal.rejected(_REPORTED)
        if result.left == 0 and not result.rejected_count and not keep:
            journal.delete()
        return result


def _settle_outcome(journal: FileJournal, meta: JournalMeta, client: object, result: Synced) -> None:
    """A journal without the training's outcome: its process died. Its run is ended KILLED, unless it is an elastic
    training's (the other ranks may go on in the same run: handed over, left as it is) or already ended. When it
    had moved to memory, what memory delivered was not written back: points the run holds are not sent again."""
    if meta.final_status or meta.ended:
        return
    if meta.moved_to_memory and meta.resume != "skip":
        journal.update_meta(resume="skip")
        result.notes.append("it moved to memory during the training and its process died before writing back what "
                            "memory delivered: points the run holds are not sent again")  # fmt: skip
    if meta.elastic:
        journal.update_meta(ended=True)
        result.notes.append("an elastic training's journal without an outcome (its rank 0 died; the others may go "
                            "on in the same run): delivered, and the run is left as it is")  # fmt: skip
        return
    if meta.run_id and meta.created_run:
        status = client.get_run(meta.run_id).info.status  # type: ignore[attr-defined]
        if status != "RUNNING":  # ended already (by the training's memory journal, by hand): left as it is
            journal.update_meta(ended=True)
            result.notes.append(f"its run is {status} already: left as it is")
            return
    journal.update_meta(final_status="KILLED")
