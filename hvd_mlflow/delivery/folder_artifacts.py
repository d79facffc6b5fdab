"""Which files of a local folder go into a run's artifacts, and where: the sender uploads a folder entry (TensorBoard's
log folder at the end of ``fit``) file by file, with profiler traces left out unless asked for.
"""

from __future__ import annotations

from pathlib import Path

PROFILE_DIR = ("plugins", "profile")  # where TensorBoard's profiler (profile_batch) writes its traces


def files(folder: Path, profile: bool) -> list[tuple[Path, str]]:
    """Every file under ``folder`` with the artifact sub-folder it goes to (profiler traces only with ``profile``)."""
    out = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder)
        if not profile and _under_profile(relative.parts):
            continue
        out.append((path, "/".join(relative.parts[:-1])))
    return out


def _under_profile(parts: tuple[str, ...]) -> bool:
    size = len(PROFILE_DIR)
    return any(parts[i : i + size] == PROFILE_DIR for i in range(len(parts) - size + 1))
