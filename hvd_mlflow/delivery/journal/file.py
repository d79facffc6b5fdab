"""The durable journal: one SQLite file per ``fit`` on rank 0 (:class:`FileJournal`).

Standard library ``sqlite3``, WAL mode, ``synchronous=FULL``: each epoch's global values are committed in one
synced transaction before the epoch counts as logged, so a crash, a SIGKILL or a tracking outage loses nothing. What
the training thread journals between epochs (params, tags, batch values) is committed without an fsync
(``durable=False``): a killed process keeps it, and the epoch's commit syncs it, so the training thread pays one
fsync per epoch. Files are created readable by their owner only, and hold no secret: the tracking URI is stored
with its credentials masked. The process that created the file holds its writer lock (:mod:`.writer`).

Written on rank 0's training thread (inside the guard, through :class:`~.live.LiveJournal`, which serialises the
calls and moves to memory when the file fails); read, and acknowledged, by the sender thread; opened again, once
no writer is left, by ``hvd-mlflow sync`` to upload what is left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .finding import companions
from .records import DELIVERED, PENDING, REJECTED, SUFFIX, Entry, Journal, JournalMeta, NewEntry
from .writer import WriterLock, written_now

_SCHEMA = """
PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
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


class FileJournal(Journal):
    """One training's journal file. One connection, used from any thread; :class:`~.live.LiveJournal` serialises."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._db = connection
        self._writer_lock = WriterLock(path)

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
            journal._writer_lock.take()
            with journal._synchronous(durable=False):  # made durable by the first durable commit (an epoch's)
                journal._write_meta(meta)
        except BaseException:
            if journal is not None:
                journal.close()
            for leftover in companions(path):
                leftover.unlink(missing_ok=True)
            raise
        return journal

    @classmethod
    def open(cls, path: Path | str, timeout: float = 60) -> FileJournal:
        """An existing journal (for ``sync``); ``timeout``: how long a statement waits for another writer."""
        db = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
        try:
            db.executescript(_SCHEMA)
        except BaseException:
            db.close()
            raise
        return cls(Path(path), db)

    # -- liveness --------------------------------------------------------------------------------------
    def take_over(self) -> bool:
        """Become the journal's writer (for ``sync``): False while another process may still send from it (as far as
        the filesystem's locks reach: :mod:`.writer`)."""
        return not written_now(self.path, self.meta()) and self._writer_lock.take()

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

    def _write_meta(self, meta: JournalMeta, in_transaction: bool = False) -> None:
        with contextlib.nullcontext() if in_transaction else self._transaction():
            self._db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", meta.to_rows().items())

    def meta(self) -> JournalMeta:
        return JournalMeta.from_rows(dict(self._db.execute("SELECT key, value FROM meta")))

    def update_meta(self, **changes: Any) -> JournalMeta:
        meta = dataclasses.replace(self.meta(), **changes)
        self._write_meta(meta)
        return meta

    # -- entries ---------------------------------------------------------------------------------------
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
        # FULL set again when durable: a failed restore below must not last
        self._db.execute("PRAGMA synchronous=FULL" if durable else "PRAGMA synchronous=NORMAL")
        try:
            yield
        finally:
            if not durable:
                with contextlib.suppress(sqlite3.Error):  # the statement's own error is the one to tell
                    self._db.execute("PRAGMA synchronous=FULL")

    def pending(self, limit: int = 1000, kinds: tuple[str, ...] | None = None, after: int = 0) -> list[Entry]:
        """Up to ``limit`` unacknowledged entries (of ``kinds``, if given) with a sequence number above ``after``,
        oldest first."""
        of_kinds = "" if kinds is None else f"AND kind IN ({','.join('?' * len(kinds))})"
        rows = self._db.execute(
            f"SELECT seq, kind, step, timestamp_ms, payload FROM entries WHERE state = ? AND seq > ? {of_kinds} "
            "ORDER BY seq LIMIT ?",
            (PENDING, after, *(kinds or ()), limit),
        )
        return [Entry(seq, kind, step, ts, json.loads(payload)) for seq, kind, step, ts, payload in rows]

    def count(self, state: int = PENDING) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM entries WHERE state = ?", (state,)).fetchone()[0])

    def acknowledge(self, seqs: Iterable[int], state: int = DELIVERED, reason: str | None = None) -> None:
        """Mark entries delivered, or rejected (``reason``: the server's answer, kept for ``sync`` to report)."""
        rows = [(seq, state, reason) for seq in seqs]
        if rows:
            with self._transaction():
                self._settle(rows)

    def _settle(self, settled: Iterable[tuple[int, int, str | None]]) -> None:
        """Set each entry's state (``settled``: seq, state, reason), and keep the reason of each rejection."""
        rows = list(settled)
        self._db.executemany("UPDATE entries SET state = ? WHERE seq = ?", [(state, seq) for seq, state, _ in rows])
        self._db.executemany("INSERT OR REPLACE INTO rejections (seq, reason) VALUES (?, ?)",
                             [(seq, why) for seq, state, why in rows if state == REJECTED and why])  # fmt: skip

    def write_back(self, settled: Iterable[tuple[int, int, str | None]], entries: Iterable[Entry],
                   meta: JournalMeta) -> None:  # fmt: skip
        """What a memory journal did after this file failed, in one transaction: ``settled`` (seq, state,
        reason) acknowledgements of the file's entries, the ``entries`` still pending (those journaled in memory
        are added, with their sequence numbers), and the meta."""
        with self._transaction():
            self._settle(settled)
            self._db.executemany(
                "INSERT OR IGNORE INTO entries (seq, kind, step, timestamp_ms, payload) VALUES (?, ?, ?, ?, ?)",
                [(e.seq, e.kind, e.step, e.timestamp_ms, json.dumps(e.payload, allow_nan=True)) for e in entries],
            )
            self._write_meta(meta, in_transaction=True)

    def rejected(self, limit: int = 100) -> list[tuple[Entry, str]]:
        """Up to ``limit`` entries the server refused for good, oldest first, with the reason it gave."""
        rows = self._db.execute(
            "SELECT e.seq, e.kind, e.step, e.timestamp_ms, e.payload, COALESCE(r.reason, 'no reason recorded') "
            "FROM entries e LEFT JOIN rejections r ON r.seq = e.seq WHERE e.state = ? ORDER BY e.seq LIMIT ?",
            (REJECTED, limit),
        )
        return [(Entry(seq, kind, step, ts, json.loads(payload)), why) for seq, kind, step, ts, payload, why in rows]

    def checkpoint(self) -> None:
        """Everything committed into the main file, the WAL emptied: the file alone holds the journal (a user who
        downloads or copies only the file the end-of-fit warning names can ``sync`` it)."""
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        self._db.close()
        self._writer_lock.release()

    def delete(self) -> None:
        """Remove a fully delivered journal file (and its WAL companions and lock)."""
        self.close()
        for path in companions(self.path):
            path.unlink(missing_ok=True)
