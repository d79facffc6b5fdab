"""What a journal holds and promises, shared by every kind of journal: its entries (:class:`Entry`), its typed
description (:class:`JournalMeta`), the states an entry goes through, what a journal file is named, what a journal
file can fail with, and what the uploader needs of any journal (:class:`Journal`).

Plain data, no I/O: used wherever a journal is, on rank 0's training thread (which writes the journal, inside the
guard), on its sender thread and in ``hvd-mlflow sync`` (which read it and acknowledge what was delivered).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import sqlite3
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

SUFFIX = ".journal.sqlite"
LOCK_SUFFIX = ".lock"
PENDING, DELIVERED, REJECTED = 0, 1, 2
# What a journal file can fail with: every SQLite error (full disk, read-only file, no locking on a network
# mount, a corrupt file) and the OS errors around it.
STORAGE_ERRORS: tuple[type[BaseException], ...] = (sqlite3.Error, OSError)


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
    tracking_uri: str = ""  # credentials masked; "": MLflow's default in ``working_directory`` (not resolved yet)
    working_directory: str = ""  # the training's: where MLflow's default store is
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
                    "host": socket.gethostname(), "working_directory": os.getcwd()}  # fmt: skip
        return cls(**{**defaults, **fields})

    def to_rows(self) -> dict[str, str | None]:
        def row(value: Any) -> str | None:
            if isinstance(value, bool):
                return "1" if value else "0"
            return json.dumps(dict(value)) if isinstance(value, Mapping) else None if value is None else str(value)

        return {field.name: row(getattr(self, field.name)) for field in dataclasses.fields(self)}

    @classmethod
    def from_rows(cls, rows: Mapping[str, str | None]) -> JournalMeta:
        fields = [(f.name, _READ.get(re.split(r"\W", str(f.type))[0], str)) for f in dataclasses.fields(cls)]
        return cls(**{name: read(rows[name]) for name, read in fields if rows.get(name) is not None})


# How from_rows reads a stored row back, by its field's type (its first word); any other: the text (a TEXT column).
_READ: dict[str, Callable[[str], Any]] = {
    "bool": lambda raw: raw == "1",
    "float": float,
    "int": int,
    "Mapping": lambda raw: json.loads(raw or "{}"),
}


class Journal:
    """What the uploader needs of a journal, whichever kind (file, memory, or the training's live one): ``location``,
    ``meta()``, ``update_meta(**changes)``, ``append_many(entries, durable)``, ``pending(limit, kinds, after)``,
    ``count(state)``, ``acknowledge(seqs, state, reason)``, ``close()``; and ``append``, written once here as a
    one-entry ``append_many`` (each kind implements the transaction once)."""

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
        return self.append_many([(kind, payload, step, timestamp_ms)], durable=durable)  # type: ignore[attr-defined]
