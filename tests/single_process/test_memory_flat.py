"""Rank 0's memory stays flat while the tracking server is down, and the benchmark's slope check would see a leak.

The real bench/memory_worker.py (a RunLogger, its SQLite journal, its sender thread retrying a port where nothing
listens) runs at the quick benchmark's sizes; bench/memory_slope.py judges its per-epoch RSS readings. The same
worker with a leak put in (each epoch's values kept, as a cache that is never emptied would) must fail the check,
with a slope near the leak's own size, measured apart with tracemalloc.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from bench import memory_slope
from bench.run import MEMORY_QUICK
from tests.support.mlflow_server import free_port

# RSS, not time, is asserted; the worker's epochs are paced (12 s), and it imports MLflow (once: no Keras in it)
pytestmark = [pytest.mark.once, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
METRICS = 100
LEAK = """
import sys
from hvd_mlflow.rank_zero.run_logger import RunLogger
kept = []
logged = RunLogger.log_metrics_many
def leaking(self, points, durable=True):
    points = list(points)
    kept.extend(dict(values) for _, _, values in points)
    return logged(self, points, durable)
RunLogger.log_metrics_many = leaking
sys.path.insert(0, {root!r})
from bench import memory_worker
sys.argv = ["memory_worker.py", *sys.argv[1:]]
memory_worker.main()
"""


def worker_rss(tmp_path: Path, leak: bool) -> list[float]:
    """The worker's RSS after each epoch, at the quick benchmark's sizes, MLflow's retries off (as there)."""
    epochs, epoch_s = MEMORY_QUICK
    args = [str(epochs), str(METRICS), str(tmp_path / "journal"), f"http://127.0.0.1:{free_port()}", "0" * 32,
            str(epoch_s)]  # fmt: skip
    script = ["-c", LEAK.format(root=str(ROOT))] if leak else [str(ROOT / "bench" / "memory_worker.py")]
    done = subprocess.run([sys.executable, *script, *args], capture_output=True, text=True, timeout=240,
                          env={"PATH": "/usr/bin:/bin", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(lines[0].removeprefix("RESULT "))
    assert result["sender_failures"] >= 2, result["sender_failures"]  # it kept retrying through the run
    return result["rss_bytes"]


def one_epoch_kept_bytes() -> float:
    """What keeping one epoch's values costs, by tracemalloc: the leak's own size per epoch."""
    names = [f"m{i:03d}" for i in range(METRICS)]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        kept = [dict({k: epoch + i * 1e-3 for i, k in enumerate(names)}) for epoch in range(500)]
        size = (tracemalloc.get_traced_memory()[0] - base) / len(kept)
    finally:
        tracemalloc.stop()
    return size


def test_rss_is_flat_after_the_warm_up_with_the_server_down(tmp_path):
    slope = memory_slope.rss_slope(worker_rss(tmp_path, leak=False))
    check = memory_slope.check(slope)
    assert check["passed"], check
    medians = [w["rss_mb"] for w in slope["windows"]]
    assert len(medians) >= 10
    assert max(medians) - min(medians) < 1.0, medians  # MB, over the 3,000 epochs after the warm-up


def test_the_check_fails_a_worker_that_keeps_each_epoch(tmp_path):
    slope = memory_slope.rss_slope(worker_rss(tmp_path, leak=True))
    check = memory_slope.check(slope)
    leak = one_epoch_kept_bytes()
    assert not check["passed"], check
    assert 0.5 * leak < slope["bytes_per_epoch"] < 2 * leak, (slope["bytes_per_epoch"], leak)


def test_the_slope_is_the_growth_after_the_warm_up_whatever_the_spikes():
    """Synthetic readings with a known truth: an import of 110 MB and a 2 MB cache filling inside the warm-up, a
    reading in ten 5 MB high (an upload attempt's buffers); then 0, and 1,000 bytes per epoch."""
    epochs = 4000

    def readings(growth: float) -> list[float]:
        base = [30e6 + min(e, 300) / 300 * 110e6 + min(e, 900) / 900 * 2e6 for e in range(epochs)]
        return [b + growth * e + (5e6 if e % 10 == 3 else 0.0) for e, b in enumerate(base)]

    flat = memory_slope.rss_slope(readings(0.0))
    assert abs(flat["bytes_per_epoch"]) < 1.0 and memory_slope.check(flat)["passed"]
    leaking = memory_slope.rss_slope(readings(1000.0))
    assert leaking["bytes_per_epoch"] == pytest.approx(1000.0, rel=1e-3)
    assert not memory_slope.check(leaking)["passed"]
    assert flat["warmup_epochs"] == 1000 and flat["windows"][0]["epoch"] > 1000
