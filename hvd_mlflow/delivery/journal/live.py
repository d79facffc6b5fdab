"""Rank 0's journal while it trains (:class:`LiveJournal`): a file that moves to memory, with one warning, the first
time it cannot be written (disk full, read-only directory, a filesystem where SQLite cannot work), so a journal
problem never reaches the training.

Shared by rank 0's training thread, which journals inside the guard, and its sender thread, which reads what is
pending and acknowledges what the server accepted: one lock serialises their calls. When the sender ends, what the
memory journal did is written back into the file, so ``hvd-mlflow sync`` later neither resends nor loses it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..._log import logger
from .file import FileJournal
from .memory import MEMORY_MAX_POINTS, MemoryJournal
from .records import DELIVERED, PENDING, STORAGE_ERRORS, Entry, Journal, JournalMeta, NewEntry

WRITE_BACK_TIMEOUT_S = 2.0  # at release, how long writing back what memory did may wait for the file


class LiveJournal(Journal):
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
        self._last_meta = journal.meta()
        self._last_seq = 0  # the highest sequence number handed out: a memory journal continues after it
        self._released = False
        self._left_at_release = 0
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
            return cls(MemoryJournal(meta))

    @property
    def in_memory(self) -> bool:
        return isinstance(self._current, MemoryJournal)

    @property
    def location(self) -> str:
        return self._current.location

    @property
    def dropped_points(self) -> int:
        return getattr(self._current, "dropped_points", 0)  # a file drops nothing

    @property
    def left_in_file(self) -> int:
        """Entries the memory journal let go past its bound that the file it took them from still holds."""
        return getattr(self._current, "left_in_file", 0)

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
        memory = MemoryJournal.taking_over(file, meta, after=self._last_seq)
        self._taken = {entry.seq for entry in memory.pending(limit=10**9)}
        self._current = memory
        _mark_moved(file.path)
        logger.warning(
            "hvd-mlflow: the journal %s cannot be written any more (%s: %s); journaling in memory from now on "
            "(at most %d unsent values; what is not delivered when this process ends is lost). Training goes on. "
            "Set journal_dir (HVD_MLFLOW_JOURNAL_DIR) to a local folder with room for the next fits.",
            file.path,
            type(error).__name__,
            error,
            MEMORY_MAX_POINTS,
        )

    def meta(self) -> JournalMeta:
        self._last_meta = meta = self._call("meta")
        return meta

    def update_meta(self, **changes: Any) -> JournalMeta:
        self._last_meta = meta = self._call("update_meta", **changes)
        return meta

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
        """Entries in ``state``; after :meth:`release`, the pending entries it left (the sender thread may release
        the journal while ``close`` is about to say what is kept)."""
        with self._lock:
            if self._released and state == PENDING:
                return self._left_at_release
            return self._call("count", state)

    def checkpoint(self) -> None:
        """The file journal's WAL merged into its main file now (a sender still running keeps the file open: the
        file the warning names must hold everything by itself). Best effort, never raises."""
        with self._lock:
            if self._released or not isinstance(self._current, FileJournal):
                return
            with contextlib.suppress(*STORAGE_ERRORS):
                self._current.checkpoint()

    def release(self, delete: bool = False) -> None:
        """Close the file, which releases its writer lock (``sync`` may take over); ``delete``: remove it, when
        everything it held was delivered. Idempotent; the journal is not used after this."""
        with self._lock:
            if self._released:
                return
            self._released = True
            current = self._current
            with contextlib.suppress(*STORAGE_ERRORS):  # else 0
                self._left_at_release = current.count()
            if self.file is None:
                return
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
            with contextlib.closing(FileJournal.open(self.file.path, timeout=WRITE_BACK_TIMEOUT_S)) as again:
                again.write_back(settled, memory.pending(limit=10**9),
                                 dataclasses.replace(memory.meta(), moved_to_memory=True))  # fmt: skip
        except STORAGE_ERRORS as error:
            logger.warning(
                "hvd-mlflow: could not write back into the journal %s what was journaled in memory (%s: %s); "
                "`hvd-mlflow sync` of it may send entries again that were delivered (points already in the run are "
                "skipped unless resume='log')",
                self.file.path,
                type(error).__name__,
                error,
            )


def _mark_moved(path: Path) -> None:
    """Say in the file, at once, that the journal moved to memory, through a new connection that never waits for a
    lock (the failed one may be unusable): a ``sync`` after a crash then knows that memory may have delivered some
    of its pending entries. Nothing when the file cannot be written at all: the write-back at release tries again."""
    try:
        with contextlib.closing(FileJournal.open(path, timeout=0)) as marker:
            marker.update_meta(moved_to_memory=True)
    except STORAGE_ERRORS as error:
        logger.debug("hvd-mlflow: could not mark %s as moved to memory: %s", path, error)
