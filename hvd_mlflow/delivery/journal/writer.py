"""Who writes a journal: the OS lock its writer holds, and how others tell whether a writer is still there.

While a process may still send from a journal it holds an OS lock on it (``flock`` on ``<journal>.lock``, released
by the kernel when the process dies), so ``sync`` never uploads beside a live sender on the same host, nor from
another host where the filesystem shares ``flock`` across hosts (NFS); on mounts where it is host-local (blobfuse
and many FUSE mounts), another host does not see the lock. On a filesystem without locks the writer's pid and
host, kept in the journal's meta, stand in for the lock.

:class:`WriterLock` is taken on rank 0's training thread when the journal file is created (and by ``hvd-mlflow
sync`` when it takes a journal over), and released when the sender ends; :func:`writer_state` and
:func:`written_now` are asked by ``sync``, read-only, before it opens a journal.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path

from .records import LOCK_SUFFIX, JournalMeta

_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


class WriterLock:
    """The writer lock of the journal at ``journal_path``, held by this process once :meth:`take` succeeded."""

    def __init__(self, journal_path: Path) -> None:
        self.path = Path(str(journal_path) + LOCK_SUFFIX)
        self._fd: int | None = None

    def take(self) -> bool:
        """Take the writer lock; False when another process holds it. On a filesystem without locks there is
        nothing to take: True, and ``sync`` judges by the writer's pid on the same host instead."""
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            return error.errno not in _BUSY
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def writer_state(path: Path) -> str:
    """``"alive"`` when a process (on this host, or another where ``flock`` spans hosts) holds ``path``'s writer
    lock, ``"gone"`` when none does, ``"unknown"`` when the filesystem cannot tell (no lock file, or no locks)."""
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


def written_now(path: Path, meta: JournalMeta) -> bool:
    """Whether a process may still send from the journal at ``path`` (``meta``: its meta, read read-only), judged
    without opening it: its writer lock is held, or, where there are no locks, its writer's pid lives on this
    host. ``sync`` leaves such a journal alone, unopened."""
    state = writer_state(path)
    if state != "unknown":
        return state == "alive"
    # the process that wrote ``meta`` lives on this host (and is not this process)
    return meta.host == socket.gethostname() and bool(meta.pid) and _pid_alive(meta.pid or 0)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != os.getpid()
