"""Open MPI's ``mpirun -np 2`` on this one host, no namespaces, no root needed (as root: Open MPI's own switch).

What happens depends on how Horovod was built, so each environment checks its own case:
* Horovod with MPI (the primary environment, as AzureML's images): the example trains as one job of 2 ranks, and
  one run holds one point per metric per epoch.
* Horovod without MPI (the TF 2.15 environment): each process is a Horovod world of its own (size 1, rank 0) while
  the launcher says 2. Every process stops at ``fit``'s start with one clear message naming the cause and the fix,
  and nothing reaches the server: never two writers of local values.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.environment import clean_environment

pytestmark = [pytest.mark.mpirun, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[2]


def mpirun(np: int, argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    if shutil.which("mpirun") is None:
        why = "Open MPI's mpirun is not installed (apt-get install openmpi-bin)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
    variables = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "HVD_MLFLOW_LOG_MODELS": "0", **root, **env}
    loopback = ["--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo", "--mca", "btl", "self,vader"]
    command = ["mpirun", "--oversubscribe", "--bind-to", "none", "--tag-output", *loopback, "-np", str(np), *argv]
    return subprocess.run(command, env={**clean_environment(), **variables}, cwd=cwd, capture_output=True, text=True,
                          timeout=400)  # fmt: skip


def horovod_has_mpi() -> bool:
    import horovod.tensorflow as hvd

    return hvd.mpi_built()


def test_mpirun_on_one_host(tmp_path, mlflow_server, client):
    experiment = f"mpirun-{uuid.uuid4().hex[:8]}"
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_EXPERIMENT_NAME": experiment}
    if horovod_has_mpi():
        done = mpirun(2, [sys.executable, str(REPO / "examples" / "train_cnn.py"), "--epochs", "2"], env, tmp_path)
        assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
        (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
        assert run.info.status == "FINISHED"
        assert run.data.params["world_size"] == "2"
        assert run.data.tags["hvd_mlflow.hosts"] == f"{socket.gethostname()}:0-1"
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
            assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == [0, 1], key
        return
    worker = REPO / "tests" / "workers" / "fit_worker.py"
    done = mpirun(2, [sys.executable, str(worker), "--out", str(tmp_path), "--epochs", "2"],
                  {**env, "HVD_MLFLOW_TESTING": "1"}, tmp_path)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-6000:]
    for rank in (0, 1):  # every process said it, tagged by Open MPI with its own rank
        said = [line for line in output.splitlines() if line.startswith(f"[1,{rank}]")]
        assert any("LauncherMismatchError" in line for line in said), said[-20:]
        assert any("Open MPI's mpirun started 2 processes, but Horovod sees a world of 1" in line for line in said)
    assert "horovodrun --gloo" in output and "HOROVOD_WITH_MPI=1" in output
    made = client.get_experiment_by_name(experiment)
    assert made is None or client.search_runs([made.experiment_id]) == []  # no writer at all


def test_doctor_under_mpirun_on_one_host(tmp_path):
    cli = str(Path(sys.executable).parent / "hvd-mlflow")
    done = mpirun(2, [cli, "doctor"], {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'x.db'}"}, tmp_path)
    reports = [line for line in done.stdout.splitlines() if " engine " in line]
    host = socket.gethostname()
    if horovod_has_mpi():
        assert done.returncode == 0, done.stdout + done.stderr
        assert len(reports) == 1 and reports[0].startswith("[1,0]"), done.stdout
        assert f"world of 2 on 1 hosts, 2 ranks per host ({host}:0-1); rank 0 on {host}" in reports[0]
    else:  # every process is rank 0 of its own world, and says what is wrong
        assert done.returncode != 0
        assert sorted(line[:5] for line in reports) == ["[1,0]", "[1,1]"], done.stdout
        assert all("!! engine" in line and "Horovod sees 1 in each" in line for line in reports)
        assert "HOROVOD_WITH_MPI=1" in done.stdout
