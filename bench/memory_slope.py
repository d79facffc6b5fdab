"""The memory check of the server-down benchmark: rank 0's resident memory must stay flat after its warm-up.

One number at one epoch says little (the issue-48 quick run read 30 MB at epoch 31, 41 MB at 151 and 103 MB at 300:
the sender thread was importing MLflow meanwhile), so the check is a slope: the epochs after the warm-up are cut into
windows, each window's RSS is the median of its per-epoch readings (a transient allocation, such as one upload
attempt, moves a reading, not a median), and a least-squares line through the window medians gives the growth in
bytes per epoch. Used by ``bench/run.py`` (the memory section, in the quick mode CI runs and in the full one).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

# The epochs before this fraction are the warm-up: the sender's MLflow import (the worker waits for it before its
# first epoch, bench/memory_worker.py) and its first requests, and SQLite's page cache of the journal filling up
# (its default 2 MB: about the first 1,000 epochs of 100 metrics; flat from there, measured).
WARMUP_FRACTION = 0.25
WINDOWS = 20  # over all the epochs; those inside the warm-up are left out of the fit
# What rank 0's RSS may still grow per epoch after the warm-up: 256 bytes, 2.5 MB over 10,000 epochs. Keeping one
# epoch's 100 values (about 2.4 KB as Python floats in a dict) would be 10x this; issue 48's quick run grew 240 KB
# per epoch. Measured once warm (bench/README.md, section 5): -10 to +40 bytes per epoch.
MAX_BYTES_PER_EPOCH = 256.0


def rss_slope(rss_bytes: Sequence[float]) -> dict:
    """The growth of ``rss_bytes`` (one reading per epoch, in order) after the warm-up: the window medians, and the
    least-squares slope through them in bytes per epoch."""
    epochs = len(rss_bytes)
    size = max(1, epochs // WINDOWS)
    windows = []
    for start in range(0, epochs - size + 1, size):
        end = start + size
        if start >= WARMUP_FRACTION * epochs:
            windows.append({"epoch": (start + end + 1) / 2, "rss_mb": statistics.median(rss_bytes[start:end]) / 2**20})
    slope = _least_squares([w["epoch"] for w in windows], [w["rss_mb"] * 2**20 for w in windows])
    return {"windows": windows, "bytes_per_epoch": slope, "warmup_epochs": int(WARMUP_FRACTION * epochs)}


def check(slope: dict) -> dict:
    """Whether ``slope`` (:func:`rss_slope`) is within :data:`MAX_BYTES_PER_EPOCH`."""
    passed = len(slope["windows"]) >= 3 and slope["bytes_per_epoch"] <= MAX_BYTES_PER_EPOCH
    return {"bytes_per_epoch": slope["bytes_per_epoch"], "budget_bytes_per_epoch": MAX_BYTES_PER_EPOCH,
            "passed": passed}  # fmt: skip


def _least_squares(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The slope of the least-squares line through the points (0 for fewer than two)."""
    if len(xs) < 2:
        return 0.0
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
