"""The durable record, on rank 0's disk, of what was measured and what the tracking server acknowledged.

One SQLite file per ``fit`` (standard library ``sqlite3``, WAL mode, ``synchronous=FULL``): each epoch's
global values are committed in one transaction before the epoch counts as logged, so a crash, a SIGKILL or a
tracking outage loses nothing. The sender marks entries acknowledged once the server accepted them;
``hvd-mlflow sync`` uploads what is left. Files are created readable by their owner only, and hold no
secret: the tracking URI is stored with its credentials masked.

Example::

    journal = Journal.create(Path(".hvd_mlflow/journal"), {"tracking_uri": "http://127.0.0.1:5000"})
    journal.append("metrics", {"loss": 0.25}, step=0, timestamp_ms=1730000000000)
    for entry in journal.pending():
        ...
        journal.acknowledge([entry.seq])
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SUFFIX = ".journal.sqlite"
PENDING, DELIVERED, REJECTED = 0, 1, 2

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
"""


@dataclasses.dataclass(frozen=True)
class Entry:
    seq: int
    kind: str
    step: int | None
    timestamp_ms: int | None
    payload: dict[str, Any]


def default_directory() -> Path:
    """``$HVD_MLFLOW_JOURNAL_DIR``, else ``.hvd_mlflow/journal`` under the working directory."""
    return Path(os.environ.get("HVD_MLFLOW_JOURNAL_DIR") or Path(".hvd_mlflow") / "journal")


def find(directory: Path | None = None) -> list[Path]:
    """The journal files in ``directory`` (default: :func:`default_directory`), oldest first."""
    directory = directory or default_directory()
    return sorted(directory.glob("*" + SUFFIX)) if directory.is_dir() else []


class Journal:
    """One training's journal. Each thread uses its own instance (SQLite connections are per thread)."""

    def __init__(self, path: Path | str, connection: sqlite3.Connection) -> None:
        self.path = path
        self._db = connection

    # -- opening ---------------------------------------------------------------------------------------
    @classmethod
    def create(cls, directory: Path, meta: Mapping[str, str | None]) -> Journal:
        """A new journal file in ``directory`` (made owner-only), holding ``meta``."""
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = directory / f"{stamp}-{uuid.uuid4().hex[:8]}{SUFFIX}"
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        journal = cls.open(path)
        journal.set_meta({"journal_id": uuid.uuid4().hex, "created": str(time.time()), **meta})
        return journal

    @classmethod
    def in_memory(cls, meta: Mapping[str, str | None]) -> Journal:
        """A journal that lives only as long as this process (when no file can be written)."""
        name = f"file:hvd_mlflow_{uuid.uuid4().hex}?mode=memory&cache=shared"
        journal = cls._connect(name, uri=True)
        journal.set_meta({"journal_id": uuid.uuid4().hex, "created": str(time.time()), **meta})
        return journal

    @classmethod
    def open(cls, path: Path | str) -> Journal:
        """Another handle on an existing journal (for another thread, or for ``sync``)."""
        return cls._connect(str(path), uri=str(path).startswith("file:"))

    @classmethod
    def _connect(cls, name: str, uri: bool) -> Journal:
        db = sqlite3.connect(name, timeout=60, isolation_level=None, uri=uri, check_same_thread=False)
        if not uri:
            db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(_SCHEMA)
        return cls(Path(name) if not uri else name, db)

    def reopen(self) -> Journal:
        return Journal.open(self.path)

    @property
    def is_file(self) -> bool:
        return isinstance(self.path, Path)

    def close(self) -> None:
        self._db.close()

    # -- meta ------------------------------------------------------------------------------------------
    def set_meta(self, values: Mapping[str, str | None]) -> None:
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [(k, v) for k, v in values.items()],
            )

    def meta(self) -> dict[str, str | None]:
        return dict(self._db.execute("SELECT key, value FROM meta"))

    # -- entries ---------------------------------------------------------------------------------------
    def append(
        self, kind: str, payload: Mapping[str, Any], step: int | None = None, timestamp_ms: int | None = None
    ) -> int:
        """Commit one entry durably and return its sequence number."""
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO entries (kind, step, timestamp_ms, payload) VALUES (?, ?, ?, ?)",
                (kind, step, timestamp_ms, json.dumps(dict(payload), allow_nan=True)),
            )
        return int(cursor.lastrowid)

    def pending(self, limit: int = 1000) -> list[Entry]:
        """Up to ``limit`` unacknowledged entries, oldest first."""
        rows = self._db.execute(
            "SELECT seq, kind, step, timestamp_ms, payload FROM entries WHERE state = ? ORDER BY seq LIMIT ?",
            (PENDING, limit),
        )
        return [Entry(seq, kind, step, ts, json.loads(payload)) for seq, kind, step, ts, payload in rows]

    def count(self, state: int = PENDING) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM entries WHERE state = ?", (state,)).fetchone()[0])

    def acknowledge(self, seqs: Iterable[int], state: int = DELIVERED) -> None:
        with self._db:
            self._db.executemany("UPDATE entries SET state = ? WHERE seq = ?", [(state, s) for s in seqs])

    def delete(self) -> None:
        """Remove a fully delivered journal file (and its WAL companions)."""
        self.close()
        if self.is_file:
            for suffix in ("", "-wal", "-shm"):
                Path(str(self.path) + suffix).unlink(missing_ok=True)
