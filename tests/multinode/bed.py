"""The multi-node test bed: a :class:`~tests.support.cluster.Cluster` with a tracking host, and a job launcher.

One bed serves every case of the module (a fresh cluster and tracking server cost ~20 s). The tracking host runs
both fronts on one real ``mlflow server``: a plain one (``http://trk:5000``) and the offline AzureML front
(``azureml://trk:5443/...``, the real plugin's path). Each job gets fresh node directories holding a copy of the
code (the test workers), as AzureML copies the code snapshot to each node's disk.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.cluster import REPO, Cluster
from tests.support.environment import clean_environment

WORKERS = REPO / "tests" / "workers"
PLAIN_PORT, AZUREML_PORT = 5000, 5443
# What every rank of a test job gets (mpirun -x), besides the job's MLflow variables.
TEST_VARIABLES = {
    "HVD_MLFLOW_TESTING": "1",
    "HVD_MLFLOW_LOG_MODELS": "0",
    "HVD_MLFLOW_CHECK_DIVERGENCE": "0",  # each rank trains on its own (fit_worker.py)
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "PYTHONUNBUFFERED": "1",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30",
}
PASSED_ON = ("TF_USE_LEGACY_KERAS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")  # this machine's, to every rank


@dataclass
class Job:
    returncode: int
    output: str
    seconds: float
    nodes: dict[str, Path]  # node name -> its working directory

    def rank(self, r: int, ranks_per_node: int = 2) -> dict:
        node = f"node{r // ranks_per_node}"
        return json.loads((self.nodes[node] / f"rank{r}.json").read_text())

    def check(self) -> Job:
        assert self.returncode == 0, f"job failed (exit {self.returncode}):\n{self.output[-8000:]}"
        return self


class Bed:
    def __init__(self, folder: Path) -> None:
        self.cluster = Cluster(folder)
        self.folder = folder
        self.trk = folder / "trk"
        self.tracking: subprocess.Popen | None = None
        self._environment = clean_environment()
        self._jobs = 0

    # -- life cycle ------------------------------------------------------------------------------------
    def up(self) -> Bed:
        self.cluster.up()
        try:
            self._start_tracking_host()
        except BaseException:
            self.down()
            raise
        return self

    def _start_tracking_host(self) -> None:
        self.trk.mkdir(parents=True, exist_ok=True)
        address = self.cluster.hosts["trk"].address
        for name, port, extra in (("plain", PLAIN_PORT, []), ("azureml", AZUREML_PORT, ["--azureml"])):
            folder = self.trk / name
            folder.mkdir(exist_ok=True)
            argv = [sys.executable, "-m", "tests.support.tracking_host", str(folder), "trk", address, str(port), *extra]
            process = self.cluster.popen("trk", argv, self._environment, self.trk / f"{name}.log")
            setattr(self, f"_{name}", process)
        for name in ("plain", "azureml"):
            ready = self.trk / name / "ready.json"
            deadline = time.monotonic() + 150
            while not ready.exists():
                if getattr(self, f"_{name}").poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the tracking host's {name} front did not start:\n"
                                       + (self.trk / f"{name}.log").read_text()[-3000:])  # fmt: skip
                time.sleep(0.3)

    def down(self) -> None:
        for name in ("plain", "azureml"):
            process = getattr(self, f"_{name}", None)
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
        self.cluster.down()

    # -- the tracking host ---------------------------------------------------------------------------------
    def ready(self, front: str = "plain") -> dict[str, Any]:
        return json.loads((self.trk / front / "ready.json").read_text())

    def store(self, front: str = "plain"):
        """The tracking server's own store, read directly: the truth of what the server holds."""
        from mlflow import MlflowClient

        return MlflowClient(f"sqlite:///{self.trk / front / 'server' / 'mlflow.db'}")

    def seen(self, front: str = "plain") -> dict[str, Any]:
        """What the front recorded so far: every connection's peer address, every request."""
        path = self.trk / front / "seen.json"
        before = path.stat().st_mtime_ns if path.exists() else 0
        getattr(self, f"_{front}").send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while (not path.exists() or path.stat().st_mtime_ns == before) and time.monotonic() < deadline:
            time.sleep(0.05)
        return json.loads(path.read_text())

    def job_run(self, experiment: str, front: str = "plain") -> tuple[str, str, dict[str, str]]:
        """The experiment and run AzureML's control plane makes before a job: (run id, experiment id, variables)."""
        folder = self.trk / front
        (folder / "job-request.json").write_text(json.dumps({"experiment": experiment}))
        getattr(self, f"_{front}").send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            made = json.loads((folder / "job.json").read_text()) if (folder / "job.json").exists() else {}
            if made.get("experiment") == experiment:
                return made["run_id"], made["experiment_id"], made["job_environment"]
            time.sleep(0.1)
        raise RuntimeError(f"the tracking host made no run for {experiment}")

    # -- jobs --------------------------------------------------------------------------------------------
    def fresh_nodes(self) -> dict[str, Path]:
        """Empty node directories with a copy of the code (the workers), as AzureML gives each node."""
        nodes = {}
        for host in self.cluster.nodes:
            assert host.workdir is not None
            shutil.rmtree(host.workdir, ignore_errors=True)
            shutil.copytree(WORKERS, host.workdir, ignore=shutil.ignore_patterns("__pycache__"))
            nodes[host.name] = host.workdir
        return nodes

    def start(self, args: list[str], env: dict[str, str], ranks_per_node: int = 2, worker: str = "fit_worker.py"):
        """Start ``worker`` on every node with mpirun from node 0; (process, node directories, log path)."""
        self._jobs += 1
        nodes = self.fresh_nodes()
        variables = {**TEST_VARIABLES, **{k: os.environ[k] for k in PASSED_ON if k in os.environ}, **env}
        argv = [sys.executable, worker, "--out", ".", *args]
        command = self.cluster.mpirun(ranks_per_node, argv, variables, exported=sorted(variables))
        log = self.folder / f"job{self._jobs}.log"
        process = self.cluster.popen("node0", command, {**self._environment, **variables}, log)
        return process, nodes, log

    def run(self, args: list[str], env: dict[str, str], timeout: float = 300, **kwargs: Any) -> Job:
        start = time.monotonic()
        process, nodes, log = self.start(args, env, **kwargs)
        return self.wait(process, nodes, log, start, timeout)

    def wait(self, process: subprocess.Popen, nodes: dict[str, Path], log: Path, start: float, timeout: float) -> Job:
        try:
            returncode = process.wait(timeout)
        except subprocess.TimeoutExpired:
            for host in self.cluster.nodes:
                self.cluster.kill(host.name)
            process.wait(30)
            returncode = -9
        return Job(returncode, log.read_text(errors="replace"), time.monotonic() - start, nodes)

    def on_node(self, node: str, argv: list[str], env: dict[str, str], timeout: float = 300):
        """``argv`` on ``node``, in its working directory (e.g. ``hvd-mlflow sync`` after the job)."""
        done = subprocess.run([str(self.cluster.enter), node, *argv], env={**self._environment, **env},
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
        return done
