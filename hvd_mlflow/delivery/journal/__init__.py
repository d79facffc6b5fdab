"""The record, on rank 0, of what was measured and what the tracking server acknowledged.

The journal is written on rank 0's training thread, inside the guard; its sender thread reads what is pending and
marks entries acknowledged once the server accepted them; ``hvd-mlflow sync`` uploads what is left. Its parts:

- :mod:`.records`: what every journal holds and promises: :class:`Entry`, the typed description
  :class:`JournalMeta` (the run, where it goes, the training's outcome), the entry states (``PENDING``,
  ``DELIVERED``, ``REJECTED``), the file names, what a journal file can fail with, and the :class:`Journal`
  protocol the uploader works with;
- :mod:`.file`: :class:`FileJournal`, one SQLite file per ``fit`` (WAL mode, one synced transaction per epoch),
  so a crash, a SIGKILL or a tracking outage loses nothing;
- :mod:`.writer`: the OS lock a journal's writer holds (``flock`` on ``<journal>.lock``), and how ``sync`` tells
  that a live sender still holds a journal (on this host; on others only where ``flock`` spans hosts):
  :func:`writer_state`, :func:`written_now`;
- :mod:`.memory`: :class:`MemoryJournal`, the same record in this process's memory, bounded, for when no journal
  file can be written;
- :mod:`.live`: :class:`LiveJournal`, what rank 0's training thread and its sender share: it starts on a file and
  moves to memory, with one warning, the first time the file cannot be written, so a journal problem never reaches
  the training;
- :mod:`.finding`: journal files on disk, read only (:func:`find`, :func:`inspect`, :func:`pending_count`,
  :func:`companion_of`, :func:`default_directory`), for ``sync`` and ``doctor``.

What other modules use is importable from here (``from hvd_mlflow.delivery.journal import FileJournal``); the
rest from its own module (``from hvd_mlflow.delivery.journal.records import PENDING``).

Example::

    journal = FileJournal.create(Path(".hvd_mlflow/journal"), JournalMeta.new(tracking_uri="http://127.0.0.1:5000"))
    journal.append("metrics", {"loss": 0.25}, step=0, timestamp_ms=1730000000000)
    for entry in journal.pending():
        ...
        journal.acknowledge([entry.seq])
"""

from __future__ import annotations

from .file import FileJournal
from .finding import companion_of, default_directory, find, inspect, pending_count
from .live import LiveJournal
from .memory import MEMORY_MAX_POINTS, MemoryJournal
from .records import DELIVERED, REJECTED, Entry, Journal, JournalMeta, NotAJournal
from .writer import writer_state, written_now

__all__ = [
    "DELIVERED",
    "MEMORY_MAX_POINTS",
    "REJECTED",
    "Entry",
    "FileJournal",
    "Journal",
    "JournalMeta",
    "LiveJournal",
    "MemoryJournal",
    "NotAJournal",
    "companion_of",
    "default_directory",
    "find",
    "inspect",
    "pending_count",
    "writer_state",
    "written_now",
]
