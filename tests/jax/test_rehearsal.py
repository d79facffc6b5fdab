"""The AzureML job of the keras.distribution engine, rehearsed: examples/azureml/job-jax.yml's command over two
simulated nodes (tests/support/cluster.py), started by Open MPI's mpirun as AzureML's ``distribution: type: mpi``
starts it, ``keras.distribution.initialize()`` with no arguments (JAX reads Open MPI's variables), the tracking
server on a third host behind the offline AzureML front, reached through the real azureml-mlflow plugin.

The truths are independent of hvd-mlflow: the tracking server's own store, each process's own History (Keras'
callback after hvd-mlflow's, printed by the example on every process), and the source address of every request the
front recorded.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import cluster
from tests.support.checks import report
from tests.support.cluster import REPO
from tests.support.environment import clean_environment

pytestmark = [pytest.mark.jax, pytest.mark.multinode, pytest.mark.timeout(900)]

EPOCHS = 3
KEYS = ("loss", "accuracy", "val_loss", "val_accuracy")
# The history is a flat JSON object. Open MPI tags each write a process makes: print()'s text and its newline can
# arrive as two writes, and what comes next, another tag or the other process's history, then follows the object on
# the same line (seen in CI): no anchor at either end of a line.
HISTORY = re.compile(r"\[1,(\d+)\]<stdout>:process (\d+) of (\d+), history: (\{[^{}]*\})")


def test_rehearsal_of_the_jax_job_yaml(tmp_path):
    """scripts/rehearse-azureml-job.sh runs job-jax.yml (2 nodes x 1 process, the YAML's variables): the job's run
    holds one point per metric per epoch, each the value both processes' later callbacks saw, and only node 0 made
    requests; the job's run is left RUNNING (AzureML ends it)."""
    cluster.require()  # the script makes a cluster of its own
    script = REPO / "scripts" / "rehearse-azureml-job.sh"
    job = REPO / "examples" / "azureml" / "job-jax.yml"
    out_json = tmp_path / "rehearsal.json"
    venv = str(Path(sys.executable).parent.parent)  # this row's venv (no second set-up of it from inside its tests)
    started = time.monotonic()
    done = subprocess.run([str(script), "--job", str(job), "--input", f"epochs={EPOCHS}", "--report", str(out_json)],
                          cwd=REPO, env={**clean_environment(), "HVD_MLFLOW_REHEARSAL_VENV": venv},
                          capture_output=True, text=True, timeout=800)  # fmt: skip
    seconds = time.monotonic() - started
    out = done.stdout
    assert done.returncode == 0, (out + done.stderr)[-6000:]
    assert f"== 2 node(s) x 1 rank(s), mpi: PYTHONPATH=. python examples/train_cnn_jax.py --epochs {EPOCHS}" in out
    # both processes joined one JAX world of 2 (JAX's own Open MPI detection) and saw the same, global, curves
    histories = {int(m[0]): (int(m[1]), int(m[2]), json.loads(m[3])) for m in HISTORY.findall(out)}
    assert sorted(histories) == [0, 1], out[-4000:]
    assert [histories[r][:2] for r in (0, 1)] == [(0, 2), (1, 2)]
    seen = [histories[r][2] for r in (0, 1)]
    assert seen[0] == seen[1]
    run = json.loads(out_json.read_text())
    assert run["status"] == "RUNNING"
    # one point per metric per epoch, every metric of the run
    assert run["metrics"] and all([s for s, _ in points] == list(range(EPOCHS)) for points in run["metrics"].values())
    for key in KEYS:
        assert [v for _, v in run["metrics"][key]] == pytest.approx(seen[0][key], rel=1e-7), key
    assert len(run["metrics"]) <= 50
    # the global batch: world of 2, 32 per process
    assert {k: run["params"].get(k) for k in ("world_size", "batch_size")} == {"world_size": "2", "batch_size": "32"}
    # only node 0 talked to the tracking host, every request authenticated through the plugin, the run not ended
    by_host: dict[str, int] = {}
    for request in run["requests"]:
        by_host[request["host"]] = by_host.get(request["host"], 0) + 1
    assert set(by_host) == {"node0"} and set(run["connections"]) == {"node0"}, by_host
    assert not [r for r in run["requests"] if r["path"].endswith(("/runs/update", "/runs/create"))]
    assert "hosts that connected to the tracking server: node0\n" in out
    report("jax-rehearsal", requests_by_node=by_host, points_per_metric=EPOCHS, metrics=sorted(run["metrics"]),
           seconds=round(seconds, 1), hosts=run["tags"].get("hvd_mlflow.hosts"))  # fmt: skip
