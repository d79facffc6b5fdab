"""Shared checks of the fault-injection suite: run a 2-rank training through a faulty proxy, then check
what the real server holds against what Keras computed on each rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ARTIFACTS
from tests.support import launch
from tests.support.environment import clean_environment

# Make MLflow's own retries short, as a user who tunes them would (defaults: 7 retries, ~4 minutes).
FAST_RETRIES = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.2",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
    "HVD_MLFLOW_FLUSH_TIMEOUT": "45",
}
STALL_BOUND_S = 1.0  # the longest time hvd-mlflow may add to any epoch end on rank 0


def expected_global(ranks: list[dict], epochs: int) -> dict[str, list[float]]:
    """Per Keras metric, per epoch: the mean of the ranks' own values (recorded before any callback)."""
    keys = ranks[0]["local"][0].keys()
    return {k: [float(np.mean([r["local"][e][k] for r in ranks])) for e in range(epochs)] for k in keys}


def check_run(client, run_id: str, ranks: list[dict], epochs: int, extra_keys: dict | None = None) -> dict:
    """Every metric holds every epoch exactly once with the global value; returns counts for the report."""
    expected = expected_global(ranks, epochs)
    expected.update(extra_keys or {})
    present, duplicates = 0, 0
    for key, values in expected.items():
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        duplicates += len(steps) - len(set(steps))
        present += len(set(steps))
        assert sorted(steps) == list(range(epochs)), (key, sorted(steps))
        history = {m.step: m.value for m in client.get_metric_history(run_id, key)}
        for epoch, want in enumerate(values):
            assert history[epoch] == pytest.approx(want, rel=1e-6, abs=1e-7), (key, epoch)
    assert duplicates == 0
    return {"points_expected": len(expected) * epochs, "points_present": present, "duplicates": duplicates}


def longest_stall(rank0: dict) -> float:
    return max(rank0["epoch_end_s"])


def report(name: str, **values) -> None:
    """Write the case's measurements to test-artifacts/faults/ (read for the closing note)."""
    folder = ARTIFACTS / "faults"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(values, indent=2, default=str))


def sync(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = clean_environment()
    return subprocess.run(
        [str(Path(sys.executable).parent / "hvd-mlflow"), "sync", *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def journals(out: Path) -> list[Path]:
    return sorted((out / ".hvd_mlflow" / "journal").glob("*.journal.sqlite"))


__all__ = [
    "FAST_RETRIES",
    "STALL_BOUND_S",
    "check_run",
    "journals",
    "launch",
    "longest_stall",
    "report",
    "sync",
]
