"""Which files of a local folder go into a run's artifacts, and where: the sender uploads a folder entry (TensorBoard's
log folder at the end of ``fit``) file by file, with profiler traces left out unless asked for.

A log folder is often reused (``logs/`` of every earlier run, or of another training beside this one): only the files
this ``fit`` created or changed go into its run. :func:`snapshot` records each file's size and modification time
when ``fit`` starts; :func:`changed`, after ``fit``, lists the files that are new or differ from it, leaving out the
sub-folders named in ``skip`` (other ranks' ``rank-<N>/``, which those ranks may still be writing, on their own disks).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

PROFILE_DIR = ("plugins", "profile")  # where TensorBoard's profiler (profile_batch) writes its traces
Snapshot = Mapping[str, tuple[int, int]]  # a file's path relative to the folder -> (size, mtime_ns)


@dataclass(frozen=True)
class FolderUpload:
    """A local folder to upload under the artifact ``path`` at the end of a fit: only what changed since ``before``."""

    folder: str
    path: str
    profile: bool = False  # with profiler traces
    before: Snapshot = field(default_factory=dict)  # the folder's files when the fit started
    skip: tuple[str, ...] = ()  # top-level sub-folders never uploaded


def snapshot(folder: str | Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` (relative, ``/``-separated) with its size and ``mtime_ns``; never raises (a file that
    cannot be read is left out, an absent folder is empty)."""
    out: dict[str, tuple[int, int]] = {}
    root = Path(folder)
    for directory, _, names in os.walk(root, onerror=lambda _: None):
        for name in names:
            path = Path(directory) / name
            try:
                stat = path.stat()
            except OSError:
                continue
            out[path.relative_to(root).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return out


def changed(upload: FolderUpload) -> list[str]:
    """The files of ``upload.folder`` that are new or changed since ``upload.before``, sorted, without ``skip``'s
    sub-folders and (unless ``profile``) profiler traces."""
    now = snapshot(upload.folder)
    out = []
    for relative, state in sorted(now.items()):
        parts = tuple(relative.split("/"))
        if upload.before.get(relative) == state or (parts[0] in upload.skip and len(parts) > 1):
            continue
        if not upload.profile and _under_profile(parts):
            continue
        out.append(relative)
    return out


def files(folder: Path, profile: bool, only: Iterable[str] | None = None) -> list[tuple[Path, str]]:
    """The files to upload with the artifact sub-folder each goes to: ``only`` those (relative paths, as
    :func:`changed` gives them; those gone are left out), else every file under ``folder`` (profiler traces only
    with ``profile``)."""
    if only is not None:
        chosen = [folder / relative for relative in only if (folder / relative).is_file()]
    else:
        chosen = sorted(p for p in folder.rglob("*") if p.is_file())
    out = []
    for path in chosen:
        relative = path.relative_to(folder)
        if not profile and _under_profile(relative.parts):
            continue
        out.append((path, "/".join(relative.parts[:-1])))
    return out


def _under_profile(parts: tuple[str, ...]) -> bool:
    return f"/{'/'.join(PROFILE_DIR)}/" in f"/{'/'.join(parts)}/"  # PROFILE_DIR's parts, one after the other
