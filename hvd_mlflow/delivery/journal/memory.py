"""The journal in this process's memory (:class:`MemoryJournal`), bounded: used when no journal file can be written.

Same record as a :class:`~.file.FileJournal` (entries, acknowledgements, the meta), lost when the process ends.
Rank 0's :class:`~.live.LiveJournal` moves to one the first time its file fails (on the training thread, inside the
guard, or on the sender thread), or starts in one when no file can be created; the sender thread reads it and
acknowledges what was delivered. ``hvd-mlflow import-csv`` also uploads through one.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from .file import FileJournal
from .records import DELIVERED, PENDING, REJECTED, STORAGE_ERRORS, Entry, Journal, JournalMeta, NewEntry

# A journal kept in memory holds at most this many unsent metric values (about 100 bytes each); past it the
# oldest unsent epochs are dropped, and counted.
MEMORY_MAX_POINTS = 200_000


class MemoryJournal(Journal):
    """A journal in this process's memory: thread-safe, bounded to :data:`MEMORY_MAX_POINTS` unsent values."""

    def __init__(self, meta: JournalMeta, max_points: int = MEMORY_MAX_POINTS) -> None:
        self._meta = meta
        self._max_points = max_points
        self._lock = threading.RLock()
        self._entries: collections.OrderedDict[int, tuple[Entry, int]] = collections.OrderedDict()  # pending
        self._counts = {DELIVERED: 0, REJECTED: 0}
        self._points = 0
        self._next = 1
        self._in_file: set[int] = set()  # entries taken over from a file, which still holds them pending
        self.dropped_points = 0  # values dropped past the bound that no file keeps: lost
        self.left_in_file = 0  # entries dropped past the bound that the file still holds: for sync

    location = "memory"

    @classmethod
    def taking_over(cls, journal: FileJournal, meta: JournalMeta, after: int = 0) -> MemoryJournal:
        """A memory journal that continues ``journal``: its meta, and its pending entries when they can be read
        (their sequence numbers are kept, so an acknowledgement of either copy means the same entry);
        ``took_all`` says whether they could. New entries are numbered after ``after`` too (a number the file
        may have used)."""
        memory = cls(meta)
        memory._next = after + 1
        try:
            entries = journal.pending(limit=10**9)
        except STORAGE_ERRORS:
            return memory  # they stay in the file, for ``hvd-mlflow sync``
        memory._in_file, memory.took_all = {entry.seq for entry in entries}, True  # until one is let go (_add)
        for entry in entries:
            memory._add(entry)
        return memory

    took_all = False

    def meta(self) -> JournalMeta:
        return self._meta

    def update_meta(self, **changes: Any) -> JournalMeta:
        with self._lock:
            self._meta = dataclasses.replace(self._meta, **changes)
            return self._meta

    def append_many(self, entries: Sequence[NewEntry], durable: bool = True) -> int:
        seq = 0
        with self._lock:
            for kind, payload, step, timestamp_ms in entries:
                seq = self._add(Entry(self._next, kind, step, timestamp_ms, dict(payload)))
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
                if oldest in self._in_file:  # the file keeps it: it must not be deleted at release
                    self.left_in_file, self.took_all = self.left_in_file + 1, False
                else:
                    self.dropped_points += n
        return entry.seq

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
