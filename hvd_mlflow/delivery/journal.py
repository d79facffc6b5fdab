"""The record, on rank 0, of what was measured and what the tracking server acknowledged.

:class:`FileJournal` is one SQLite file per ``fit`` (standard library ``sqlite3``, WAL mode, ``synchronous=FULL``):
each epoch's global values are committed in one synced transaction before the epoch counts as logged, so a crash, a
SIGKILL or a tracking outage loses nothing. What the training thread journals between epochs (params, tags, batch
values) is committed without an fsync (``durable=False``): a killed process keeps it, and the epoch's commit syncs
it, so the training thread pays one fsync per epoch. The sender marks entries acknowledged once the server accepted
them; ``hvd-mlflow sync`` uploads what is left. Files are created readable by their owner only, and hold no secret:
the tracking URI is stored with its credentials masked. While a process may still send from a journal it holds an OS
lock on it (``flock`` on ``<journal>.lock``, released by the kernel when the process dies, and honoured across hosts
on NFS), so ``sync``, from any host sharing the directory, never uploads beside a live sender.

:class:`MemoryJournal` is the same record in this process's memory, bounded: used when no journal file can be
written. :class:`LiveJournal` is what rank 0's training thread and its sender share: it starts on a file and
moves to memory, with one warning, the first time the file cannot be written (disk full, read-only directory, a
filesystem where SQLite cannot work), so a journal problem never reaches the training.

:class:`JournalMeta` is the journal's typed description (the run, where it goes, the training's outcome).

Example::

    journal = FileJournal.create(Path(".hvd_mlflow/journal"), JournalMeta.new(tracking_uri="http://127.0.0.1:5000"))
    journal.append("metrics", {"loss": 0.25}, step=0, timestamp_ms=1730000000000)
    for entry in journal.pending():
        ...
        journal.acknowledge([entry.seq])
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import fcntl
import itertools
import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from .. import config
from .._log import logger

SUFFIX = ".journal.sqlite"
LOCK_SUFFIX = ".lock"
PENDING, DELIVERED, REJECTED = 0, 1, 2
# What a journal file can fail with: every SQLite error (full disk, read-only file, no locking on a network
# mount, a corrupt file) and the OS errors around it.
STORAGE_ERRORS: tuple[type[BaseException], ...] = (sqlite3.Error, OSError)
# A journal kept in memory holds at most this many unsent metric values (about 100 bytes each); past it the
# oldest unsent epochs are dropped, and counted.
MEMORY_MAX_POINTS = 200_000
WRITE_BACK_TIMEOUT_S = 2.0  # at release, how long writing back what memory did may wait for the file

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,              -- 'params', 'tags', 'metrics' or 'artifact'
    step INTEGER,
    timestamp_ms INTEGER,
    payload TEXT NOT NULL,           -- JSON object: name -> value
    state INTEGER NOT NULL DEFAULT 0 -- 0 pending, 1 delivered, 2 rejected by the server (warned)
);
CREATE INDEX IF NOT EXISTS entries_pending ON entries (state, seq);
CREATE TABLE IF NOT EXISTS rejections (seq INTEGER PRIMARY KEY, reason TEXT NOT NULL);  -- why, for sync to say
"""
# What makes a file a journal, checked read-only before ``sync`` opens it for writing: its name, SQLite's header,
# these columns, and a journal id in its meta (a journal written before the rejections table still is one).
_REQUIRED_COLUMNS = {"meta": {"key", "value"}, "entries": {"seq", "kind", "step", "timestamp_ms", "payload", "state"}}
_SQLITE_HEADER = b"SQLite format 3\x00"
_COMPANION_SUFFIXES = ("-wal", "-shm", "-journal", LOCK_SUFFIX)


class NotAJournal(ValueError):
    """A file ``sync`` was given that is not an hvd-mlflow journal: it is left as it is."""


@dataclasses.dataclass(frozen=True)
class Entry:
    seq: int
    kind: str
    step: int | None
    timestamp_ms: int | None
    payload: dict[str, Any]


NewEntry = tuple[str, Mapping[str, Any], "int | None", "int | None"]  # what append takes: kind, payload, step, ms


@dataclasses.dataclass(frozen=True)
class JournalMeta:
    """What a journal is for: where its entries go, and what became of the run.

    Stored as one row per field in the journal's ``meta`` table (booleans as ``"1"``/``"0"``, ``run_tags`` as
    JSON); :meth:`to_rows` and :meth:`from_rows` are the only code that knows that layout.
    """

    journal_id: str = ""
    created: float = 0.0
    tracking_uri: str = ""  # credentials masked
    tracking_uri_has_credentials: bool = False  # then ``sync`` needs the URI again (MLFLOW_TRACKING_URI)
    run_id: str | None = None
    experiment_id: str | None = None
    experiment_name: str | None = None
    job_mode: bool = False  # an AzureML job: never create nor end the run
    resume: str = "skip"
    elastic: bool = False
    created_run: bool = False  # hvd-mlflow created the run, so it ends it with the training's outcome
    create_attempted: bool = False  # a create_run was sent: look for its run before creating another
    run_tags: Mapping[str, str] = dataclasses.field(default_factory=dict)  # tags of a run created from here
    pid: int | None = None  # the writer, for journals on filesystems without locks
    host: str | None = None
    max_metric_names: int | None = None  # the user's budget options (None: the server's limits; 0: no limit)
    max_rows_per_metric: int | None = None
    final_status: str | None = None  # FINISHED / FAILED / KILLED once the training's outcome is known
    ended: bool = False  # the run was ended (or, not ours, left as it is) after everything was delivered
    moved_to_memory: bool = False  # the training journaled in memory after the file failed; what it did there
    # (acknowledgements, entries, the outcome) was written back into the file when the process released it

    @classmethod
    def new(cls, **fields: Any) -> JournalMeta:
        """A description for a new journal: a fresh id, now, this process."""
        defaults = {"journal_id": uuid.uuid4().hex, "created": time.time(), "pid": os.getpid(),
                    "host": socket.gethostname()}  # fmt: skip
        return cls(**{**defaults, **fields})

    def to_rows(self) -> dict[str, str | None]:
        rows: dict[str, str | None] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool):
                rows[field.name] = "1" if value else "0"
            elif isinstance(value, Mapping):
                rows[field.name] = json.dumps(dict(value))
            else:
                rows[field.name] = None if value is None else str(value)
        return rows

    @classmethod
    def from_rows(cls, rows: Mapping[str, str | None]) -> JournalMeta:
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = rows.get(field.name)
            if raw is None:
                continue
            kind = str(field.type)
            if kind == "bool":
                values[field.name] = raw == "1"
            elif kind == "float":
                values[field.name] = float(raw)
            elif kind.startswith("int"):
                values[field.name] = int(raw)
            elif kind.startswith("Mapping"):
                values[field.name] = json.loads(raw or "{}")
            else:
                values[field.name] = raw
        return cls(**values)


class Journal(Protocol):
    """What the uploader needs of a journal (file or memory)."""

    @property
    def location(self) -> str: ...
    def meta(self) -> JournalMeta: ...
    def update_meta(self, **changes: Any) -> JournalMeta: ...
    def append(
        self,
        kind: str,
        payload: Mapping[str, Any],
        step: int | None = None,
        timestamp_ms: int | None = None,
        durable: bool = True,
    ) -> int: ...
    def append_many(self, entries: Sequence[NewEntry], durable: bool = True) -> int: ...
    def pending(self, limit: int = 1000, kinds: tuple[str, ...] | None = None, after: int = 0) -> list[Entry]: ...
    def count(self, state: int = PENDING) -> int: ...
    def acknowledge(self, seqs: Iterable[int], state: int = DELIVERED, reason: str | None = None) -> None: ...
    def close(self) -> None: ...


def default_directory() -> Path:
    """``$HVD_MLFLOW_JOURNAL_DIR``, else ``.hvd_mlflow/journal`` under the working directory."""
    return Path(config.environment_value("journal_dir") or Path(".hvd_mlflow") / "journal")


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
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
    try:
        return int(db.execute("SELECT COUNT(*) FROM entries WHERE state = ?", (PENDING,)).fetchone()[0])
    finally:
        db.close()


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


class FileJournal:
    """One training's journal file. One connection, used from any thread; :class:`LiveJournal` serialises."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._db = connection
        self._lock_fd: int | None = None

    @property
    def location(self) -> str:
        return str(self.path)

    # -- opening ---------------------------------------------------------------------------------------
    @classmethod
    def create(cls, directory: Path, meta: JournalMeta) -> FileJournal:
        """A new journal file in ``directory`` (made owner-only), holding ``meta``, locked by this process."""
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = directory / f"{stamp}-{uuid.uuid4().hex[:8]}{SUFFIX}"
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        journal: FileJournal | None = None
        try:
            journal = cls.open(path)
            journal._hold_writer_lock()
            with journal._synchronous(durable=False):  # made durable by the first durable commit (an epoch's)
                journal._write_meta(meta)
        except BaseException:
            if journal is not None:
                journal.close()
            for leftover in _companions(path):
                leftover.unlink(missing_ok=True)
            raise
        return journal

    @classmethod
    def open(cls, path: Path | str, timeout: float = 60) -> FileJournal:
        """An existing journal (for ``sync``); ``timeout``: how long a statement waits for another writer."""
        db = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
        except BaseException:
            db.close()
            raise
        return cls(Path(path), db)

    # -- liveness --------------------------------------------------------------------------------------
    def _hold_writer_lock(self) -> bool:
        """Take the writer lock; False when another process holds it. On a filesystem without locks there is
        nothing to take: True, and ``sync`` judges by the writer's pid on the same host instead."""
        fd = os.open(str(self.path) + LOCK_SUFFIX, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            return error.errno not in _BUSY
        self._lock_fd = fd
        return True

    def take_over(self) -> bool:
        """Become the journal's writer (for ``sync``): False while another process, on any host sharing the
        directory, may still send from it."""
        if writer_state(self.path) == "unknown" and _writer_pid_alive(self.meta()):
            return False
        return self._hold_writer_lock()

    def release_writer_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- meta ------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One transaction (one fsync) for several statements: the connection is in autocommit mode
        (``isolation_level=None``), where each statement would otherwise commit, and sync, on its own."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # SQLite may have rolled back already (disk full, I/O error)
                with contextlib.suppress(sqlite3.Error):  # the first error is the one to tell
                    self._db.execute("ROLLBACK")
            raise

    def _write_meta(self, meta: JournalMeta) -> None:
        with self._transaction():
            self._db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", meta.to_rows().items())

    def meta(self) -> JournalMeta:
        return JournalMeta.from_rows(dict(self._db.execute("SELECT key, value FROM meta")))

    def update_meta(self, **changes: Any) -> JournalMeta:
        meta = dataclasses.replace(self.meta(), **changes)
        self._write_meta(meta)
        return meta

    # -- entries ---------------------------------------------------------------------------------------
    def append(
        self,
        kind: str,
        payload: Mapping[str, Any],
        step: int | None = None,
        timestamp_ms: int | None = None,
        durable: bool = True,
    ) -> int:
        """Commit one entry and return its sequence number; ``durable``: synced before it returns (else at the
        next durable commit: a process that dies keeps it, a machine that loses power may not)."""
        return self.append_many([(kind, payload, step, timestamp_ms)], durable=durable)

    def append_many(self, entries: Sequence[NewEntry], durable: bool = True) -> int:
        """Commit several entries in one transaction (one fsync when ``durable``, none otherwise: SQLite's WAL is
        then synced by the next durable commit); the last one's sequence number (0: none)."""
        seq = 0
        with self._synchronous(durable), self._transaction():
            for kind, payload, step, timestamp_ms in entries:
                cursor = self._db.execute(
                    "INSERT INTO entries (kind, step, timestamp_ms, payload) VALUES (?, ?, ?, ?)",
                    (kind, step, timestamp_ms, json.dumps(dict(payload), allow_nan=True)),
                )
                seq = int(cursor.lastrowid)
        return seq

    @contextlib.contextmanager
    def _synchronous(self, durable: bool) -> Iterator[None]:
        """The commits inside are synced (``synchronous=FULL``, the journal's setting) or not (``NORMAL``: in WAL
        mode a commit then writes its pages without an fsync, and the next FULL commit syncs them all)."""
        if durable:
            self._db.execute("PRAGMA synchronous=FULL")  # again: a failed restore below must not last
            yield
            return
        self._db.execute("PRAGMA synchronous=NORMAL")
        try:
            yield
        finally:
            with contextlib.suppress(sqlite3.Error):  # the statement's own error is the one to tell
                self._db.execute("PRAGMA synchronous=FULL")

    def pending(self, limit: int = 1000, kinds: tuple[str, ...] | None = None, after: int = 0) -> list[Entry]:
        """Up to ``limit`` unacknowledged entries (of ``kinds``, if given) with a sequence number above ``after``,
        oldest first."""
        if kinds is None:
            rows = self._db.execute(
                "SELECT seq, kind, step, timestamp_ms, payload FROM entries WHERE state = ? AND seq > ? ORDER BY seq "
                "LIMIT ?",
                (PENDING, after, limit),
            )
        else:
            marks = ",".join("?" * len(kinds))
            rows = self._db.execute(
                "SELECT seq, kind, step, timestamp_ms, payload FROM entries WHERE state = ? AND seq > ? AND kind IN "
                f"({marks}) ORDER BY seq LIMIT ?",
                (PENDING, after, *kinds, limit),
            )
        return [Entry(seq, kind, step, ts, json.loads(payload)) for seq, kind, step, ts, payload in rows]

    def count(self, state: int = PENDING) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM entries WHERE state = ?", (state,)).fetchone()[0])

    def acknowledge(self, seqs: Iterable[int], state: int = DELIVERED, reason: str | None = None) -> None:
        """Mark entries delivered, or rejected (``reason``: the server's answer, kept for ``sync`` to report)."""
        rows = [(state, s) for s in seqs]
        if not rows:
            return
        with self._transaction():
            self._db.executemany("UPDATE entries SET state = ? WHERE seq = ?", rows)
            if state == REJECTED and reason:
                self._db.executemany("INSERT OR REPLACE INTO rejections (seq, reason) VALUES (?, ?)",
                                     [(seq, reason) for _, seq in rows])  # fmt: skip

    def write_back(self, settled: Iterable[tuple[int, int, str | None]], entries: Iterable[Entry],
                   meta: JournalMeta) -> None:  # fmt: skip
        """What a memory journal did after this file failed, in one transaction: ``settled`` (seq, state,
        reason) acknowledgements of the file's entries, the ``entries`` still pending (those journaled in memory
        are added, with their sequence numbers), and the meta."""
        with self._transaction():
            for seq, state, reason in settled:
                self._db.execute("UPDATE entries SET state = ? WHERE seq = ?", (state, seq))
                if state == REJECTED and reason:
                    self._db.execute("INSERT OR REPLACE INTO rejections (seq, reason) VALUES (?, ?)", (seq, reason))
            self._db.executemany(
                "INSERT OR IGNORE INTO entries (seq, kind, step, timestamp_ms, payload) VALUES (?, ?, ?, ?, ?)",
                [(e.seq, e.kind, e.step, e.timestamp_ms, json.dumps(e.payload, allow_nan=True)) for e in entries],
            )
            self._db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", meta.to_rows().items())

    def rejected(self, limit: int = 100) -> list[tuple[Entry, str]]:
        """Up to ``limit`` entries the server refused for good, oldest first, with the reason it gave."""
        rows = self._db.execute(
            "SELECT e.seq, e.kind, e.step, e.timestamp_ms, e.payload, COALESCE(r.reason, 'no reason recorded') "
            "FROM entries e LEFT JOIN rejections r ON r.seq = e.seq WHERE e.state = ? ORDER BY e.seq LIMIT ?",
            (REJECTED, limit),
        )
        return [(Entry(seq, kind, step, ts, json.loads(payload)), why) for seq, kind, step, ts, payload, why in rows]

    def close(self) -> None:
        self._db.close()
        self.release_writer_lock()

    def delete(self) -> None:
        """Remove a fully delivered journal file (and its WAL companions and lock)."""
        self.close()
        for path in _companions(self.path):
            path.unlink(missing_ok=True)


class MemoryJournal:
    """A journal in this process's memory: thread-safe, bounded to :data:`MEMORY_MAX_POINTS` unsent values."""

    def __init__(self, meta: JournalMeta, max_points: int = MEMORY_MAX_POINTS) -> None:
        self._meta = meta
        self._max_points = max_points
        self._lock = threading.RLock()
        self._entries: collections.OrderedDict[int, tuple[Entry, int]] = collections.OrderedDict()  # pending
        self._counts = {DELIVERED: 0, REJECTED: 0}
        self._points = 0
        self._next = 1
        self.dropped_points = 0

    location = "memory"

    @classmethod
    def taking_over(cls, journal: FileJournal, meta: JournalMeta) -> MemoryJournal:
        """A memory journal that continues ``journal``: its meta, and its pending entries when they can be read
        (their sequence numbers are kept, so an acknowledgement of either copy means the same entry);
        ``took_all`` says whether they could."""
        memory = cls(meta)
        try:
            entries = journal.pending(limit=10**9)
        except STORAGE_ERRORS:
            return memory  # they stay in the file, for ``hvd-mlflow sync``
        for entry in entries:
            memory._add(entry)
        memory.took_all = True
        return memory

    took_all = False

    def meta(self) -> JournalMeta:
        return self._meta

    def update_meta(self, **changes: Any) -> JournalMeta:
        with self._lock:
            self._meta = dataclasses.replace(self._meta, **changes)
            return self._meta

    def append(
        self,
        kind: str,
        payload: Mapping[str, Any],
        step: int | None = None,
        timestamp_ms: int | None = None,
        durable: bool = True,
    ) -> int:
        with self._lock:
            return self._add(Entry(self._next, kind, step, timestamp_ms, dict(payload)))

    def append_many(self, entries: Sequence[NewEntry], durable: bool = True) -> int:
        seq = 0
        with self._lock:
            for kind, payload, step, timestamp_ms in entries:
                seq = self.append(kind, payload, step=step, timestamp_ms=timestamp_ms)
        return seq

    def _add(self, entry: Entry) -> int:
        size = len(entry.payload) if entry.kind in ("metrics", "over_budget") else 0  # values, held ones too
        with self._lock:
            self._entries[entry.seq] = (entry, size)
            self._points += size
            self._next = max(self._next, entry.seq + 1)
            while self._points > self._max_points:
                oldest = next((s for s, (e, n) in self._entries.items() if n), None)
                if oldest is None:
                    break
                _, n = self._entries.pop(oldest)
                self._points -= n
                self.dropped_points += n
        return entry.seq

    def continue_after(self, seq: int) -> None:
        """Hand out sequence numbers after ``seq`` (those a file journal it continues may have used)."""
        with self._lock:
            self._next = max(self._next, seq + 1)

    def pending(self, limit: int = 1000, kinds: tuple[str, ...] | None = None, after: int = 0) -> list[Entry]:
        with self._lock:
            entries = (e for e, _ in self._entries.values() if e.seq > after and (kinds is None or e.kind in kinds))
            return list(itertools.islice(entries, limit))

    def count(self, state: int = PENDING) -> int:
        with self._lock:
            return len(self._entries) if state == PENDING else self._counts.get(state, 0)

    def acknowledge(self, seqs: Iterable[int], state: int = DELIVERED, reason: str | None = None) -> None:
        with self._lock:
            for seq in seqs:
                found = self._entries.pop(seq, None)
                if found is not None:
                    self._points -= found[1]
                    self._counts[state] = self._counts.get(state, 0) + 1

    def close(self) -> None:
        return None


class LiveJournal:
    """Rank 0's journal while it trains, shared by the training thread and the sender thread.

    It starts on a :class:`FileJournal` (or in memory when none could be created) and serialises every call.
    The first time the file cannot be written, from either thread, it continues in a :class:`MemoryJournal`
    that takes over the file's pending entries, with one warning; the call that failed is done there. What the
    memory journal cannot do raises (rank 0's guard then turns logging off for the fit).
    """

    def __init__(self, journal: FileJournal | MemoryJournal) -> None:
        self._current: FileJournal | MemoryJournal = journal
        self._lock = threading.RLock()
        self.file: FileJournal | None = journal if isinstance(journal, FileJournal) else None
        self.fallback_reason: str | None = None
        self._last_meta = journal.meta()
        self._last_seq = 0  # the highest sequence number handed out: a memory journal continues after it
        self._released = False
        # after a fall-back: the file's entries the memory journal took over, and what became of them there
        # (seq -> state, reason), written back into the file at release
        self._taken: set[int] = set()
        self._settled: dict[int, tuple[int, str | None]] = {}

    @classmethod
    def open_new(cls, directory: Path, meta: JournalMeta) -> LiveJournal:
        """A journal file in ``directory``; in memory (with one warning) when none can be created there."""
        try:
            return cls(FileJournal.create(directory, meta))
        except STORAGE_ERRORS as error:
            logger.warning(
                "hvd-mlflow: cannot keep a journal in %s (%s: %s); keeping it in memory (at most %d unsent values), "
                "so what is not delivered when this process ends is lost. Set HVD_MLFLOW_JOURNAL_DIR to a writable "
                "local folder.",
                directory,
                type(error).__name__,
                error,
                MEMORY_MAX_POINTS,
            )
            live = cls(MemoryJournal(meta))
            live.fallback_reason = f"{type(error).__name__}: {error}"
            return live

    @property
    def in_memory(self) -> bool:
        return isinstance(self._current, MemoryJournal)

    @property
    def location(self) -> str:
        return self._current.location

    @property
    def dropped_points(self) -> int:
        current = self._current
        return current.dropped_points if isinstance(current, MemoryJournal) else 0

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._released:
                raise RuntimeError("hvd-mlflow: this journal was released (its sender ended)")
            try:
                return getattr(self._current, method)(*args, **kwargs)
            except STORAGE_ERRORS as error:
                if not isinstance(self._current, FileJournal):
                    raise
                self._fall_back(error)
                return getattr(self._current, method)(*args, **kwargs)

    def _fall_back(self, error: BaseException) -> None:
        file = self._current
        assert isinstance(file, FileJournal)
        try:
            meta = file.meta()
        except STORAGE_ERRORS:
            meta = self._last_meta
        memory = MemoryJournal.taking_over(file, meta)
        memory.continue_after(self._last_seq)
        self._taken = {entry.seq for entry in memory.pending(limit=10**9)}
        self._current = memory
        _mark_moved(file.path)
        self.fallback_reason = f"{type(error).__name__}: {error}"
        logger.warning(
            "hvd-mlflow: the journal %s cannot be written any more (%s: %s); journaling in memory from now on "
            "(at most %d unsent values; what is not delivered when this process ends is lost). Training goes on.",
            file.path,
            type(error).__name__,
            error,
            MEMORY_MAX_POINTS,
        )

    def meta(self) -> JournalMeta:
        meta = self._call("meta")
        self._last_meta = meta
        return meta

    def update_meta(self, **changes: Any) -> JournalMeta:
        meta = self._call("update_meta", **changes)
        self._last_meta = meta
        return meta

    def append(
        self,
        kind: str,
        payload: Mapping[str, Any],
        step: int | None = None,
        timestamp_ms: int | None = None,
        durable: bool = True,
    ) -> int:
        seq = self._call("append", kind, payload, step=step, timestamp_ms=timestamp_ms, durable=durable)
        self._last_seq = max(self._last_seq, seq)
        return seq

    def append_many(self, entries: Sequence[NewEntry], durable: bool = True) -> int:
        """Several entries in one transaction (all or none of them, before a fall-back to memory retries them)."""
        seq = self._call("append_many", list(entries), durable=durable)
        self._last_seq = max(self._last_seq, seq)
        return seq

    def acknowledge(self, seqs: Iterable[int], state: int = DELIVERED, reason: str | None = None) -> None:
        seqs = list(seqs)
        with self._lock:
            self._call("acknowledge", seqs, state=state, reason=reason)
            if self.in_memory:  # bounded: at most the file's pending entries when it failed
                self._settled.update((seq, (state, reason)) for seq in seqs if seq in self._taken)

    def pending(self, limit: int = 1000, kinds: tuple[str, ...] | None = None, after: int = 0) -> list[Entry]:
        return self._call("pending", limit, kinds=kinds, after=after)

    def count(self, state: int = PENDING) -> int:
        return self._call("count", state)

    def release(self, delete: bool = False) -> None:
        """Close the file, which releases its writer lock (``sync`` may take over); ``delete``: remove it, when
        everything it held was delivered. Idempotent; the journal is not used after this."""
        with self._lock:
            if self._released:
                return
            self._released = True
            if self.file is None:
                return
            current = self._current
            if delete and (current is self.file or (isinstance(current, MemoryJournal) and current.took_all)):
                self.file.delete()
                return
            if isinstance(current, MemoryJournal):
                self._write_back(current)
            self.file.close()

    def _write_back(self, memory: MemoryJournal) -> None:
        """Record in the file, through a new connection (the failed one may be unusable), what the memory journal
        did: so ``sync`` neither resends what it delivered, nor loses what it journaled, nor ends a run whose
        outcome it knew as KILLED. When the file still cannot be written it keeps its stale entries (``sync``
        then relies on the run's contents and status), and one warning says so."""
        assert self.file is not None
        settled = [(seq, state, reason) for seq, (state, reason) in self._settled.items()]
        try:
            again = FileJournal.open(self.file.path, timeout=WRITE_BACK_TIMEOUT_S)
            try:
                again.write_back(settled, memory.pending(limit=10**9),
                                 dataclasses.replace(memory.meta(), moved_to_memory=True))  # fmt: skip
            finally:
                again.close()
        except STORAGE_ERRORS as error:
            logger.warning(
                "hvd-mlflow: could not write back into the journal %s what was journaled in memory (%s: %s); "
                "`hvd-mlflow sync` of it may send entries again that were delivered (points already in the run are "
                "skipped unless resume='log')",
                self.file.path,
                type(error).__name__,
                error,
            )


_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def writer_state(path: Path) -> str:
    """``"alive"`` when a process (on any host sharing the directory) holds ``path``'s writer lock, ``"gone"``
    when none does, ``"unknown"`` when the filesystem cannot tell (no lock file, or no locks)."""
    lock = Path(str(path) + LOCK_SUFFIX)
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return "unknown"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        return "alive" if error.errno in _BUSY else "unknown"
    finally:
        os.close(fd)
    return "gone"


def _mark_moved(path: Path) -> None:
    """Say in the file, at once, that the journal moved to memory, through a new connection that never waits for a
    lock (the failed one may be unusable): a ``sync`` after a crash then knows that memory may have delivered some
    of its pending entries. Nothing when the file cannot be written at all: the write-back at release tries again."""
    try:
        marker = FileJournal.open(path, timeout=0)
        try:
            marker.update_meta(moved_to_memory=True)
        finally:
            marker.close()
    except STORAGE_ERRORS as error:
        logger.debug("hvd-mlflow: could not mark %s as moved to memory: %s", path, error)


def written_now(path: Path, meta: JournalMeta) -> bool:
    """Whether a process may still send from the journal at ``path`` (``meta``: its meta, read read-only), judged
    without opening it: its writer lock is held, or, where there are no locks, its writer's pid lives on this
    host. ``sync`` leaves such a journal alone, unopened."""
    state = writer_state(path)
    return state == "alive" or (state == "unknown" and _writer_pid_alive(meta))


def _writer_pid_alive(meta: JournalMeta) -> bool:
    return meta.host == socket.gethostname() and bool(meta.pid) and _pid_alive(meta.pid or 0)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != os.getpid()


def _companions(path: Path) -> list[Path]:
    return [Path(str(path) + suffix) for suffix in ("", "-wal", "-shm", LOCK_SUFFIX)]
