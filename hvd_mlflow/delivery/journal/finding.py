"""Journal files on disk, read without writing to them: where they are (:func:`default_directory`, :func:`find`),
which files belong to a journal (:func:`companion_of`, :func:`companions`), whether a file is a journal at all
(:func:`inspect`) and how much of it waits to be sent (:func:`pending_count`).

Used by ``hvd-mlflow sync`` and ``hvd-mlflow doctor`` (a training may be writing the files meanwhile, so nothing
here opens one for writing), and on rank 0's training thread for the default folder of a new journal.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from ... import config
from ..destination import is_azureml_job, tracking_uri_from_environment
from .records import LOCK_SUFFIX, PENDING, SUFFIX, JournalMeta, NotAJournal

# What makes a file a journal, checked read-only before ``sync`` opens it for writing: its name, SQLite's header,
# these columns, and a journal id in its meta (a journal written before the rejections table still is one).
_REQUIRED_COLUMNS = {"meta": {"key", "value"}, "entries": {"seq", "kind", "step", "timestamp_ms", "payload", "state"}}
_SQLITE_HEADER = b"SQLite format 3\x00"
_COMPANION_SUFFIXES = ("-wal", "-shm", "-journal", LOCK_SUFFIX)


LOCAL_DIRECTORY = Path(".hvd_mlflow") / "journal"
# AzureML uploads a job's ./outputs into its run when the job ends: a journal there outlives the node
JOB_DIRECTORY = Path("outputs") / "hvd_mlflow_journal"


def default_directory() -> Path:
    """``$HVD_MLFLOW_JOURNAL_DIR``, else, in an AzureML job, ``outputs/hvd_mlflow_journal`` under the working directory
    (AzureML keeps ``./outputs`` with the job's run after the node is gone: what the server did not take survives the
    job), else ``.hvd_mlflow/journal``. A journal whose entries were all delivered is deleted, so ``outputs`` holds one
    only when something waits for ``hvd-mlflow sync``."""
    explicit = config.environment_value("journal_dir")
    if explicit:
        return Path(explicit)
    return JOB_DIRECTORY if is_azureml_job(tracking_uri_from_environment()) else LOCAL_DIRECTORY


def find(directory: Path | None = None) -> list[Path]:
    """The journal files in ``directory`` (default: :func:`default_directory`), oldest first."""
    directory = directory or default_directory()
    return sorted(directory.glob("*" + SUFFIX)) if directory.is_dir() else []


def companion_of(path: Path) -> Path | None:
    """The journal ``path`` belongs to when it is one of a journal's companions (its lock, SQLite's WAL, shared
    memory or rollback journal), else None."""
    for suffix in _COMPANION_SUFFIXES:
        if path.name.endswith(SUFFIX + suffix):
            return path.with_name(path.name[: -len(suffix)])
    return None


def pending_count(path: Path) -> int:
    """How many entries of the journal at ``path`` wait to be sent, read without writing to the file (``doctor``);
    :class:`NotAJournal` when it is not an hvd-mlflow journal."""
    inspect(path)
    with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10)) as db:
        return int(db.execute("SELECT COUNT(*) FROM entries WHERE state = ?", (PENDING,)).fetchone()[0])


def inspect(path: Path) -> JournalMeta:
    """The meta of the journal at ``path``, read without writing to the file; :class:`NotAJournal` (saying why)
    when it is not an hvd-mlflow journal. Only a file that passes is ever opened for writing by ``sync``."""
    if not path.name.endswith(SUFFIX):
        raise NotAJournal(f"its name does not end in {SUFFIX}")
    try:
        with path.open("rb") as handle:
            header = handle.read(len(_SQLITE_HEADER))
    except OSError as error:
        raise NotAJournal(f"it cannot be read: {error.strerror or error}") from None
    if header != _SQLITE_HEADER:
        raise NotAJournal("it is not an SQLite file")
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error as error:
        raise NotAJournal(f"SQLite cannot open it: {error}") from None
    try:
        for table, needed in _REQUIRED_COLUMNS.items():
            columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            if not needed <= columns:
                raise NotAJournal(f"it has no hvd-mlflow {table!r} table")
        meta = JournalMeta.from_rows(dict(db.execute("SELECT key, value FROM meta")))
    except sqlite3.Error as error:
        raise NotAJournal(f"SQLite cannot read it: {error}") from None
    except (ValueError, TypeError) as error:
        raise NotAJournal(f"its meta is not an hvd-mlflow journal's: {error}") from None
    finally:
        db.close()
    if not meta.journal_id:
        raise NotAJournal("its meta has no journal id")
    return meta


def companions(path: Path) -> list[Path]:
    """The journal file at ``path`` and the files that go with it (SQLite's WAL and shared memory, its lock)."""
    return [Path(str(path) + suffix) for suffix in ("", "-wal", "-shm", LOCK_SUFFIX)]
