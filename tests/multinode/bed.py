"""The multi-node test bed: a :class:`~tests.support.cluster.Cluster` with a tracking host, and a job launcher.

One bed serves every case of the module (a fresh cluster and tracking server cost ~20 s). The tracking host runs
two fronts, each before a real ``mlflow server`` of its own (tests/support/tracking_host.py): a plain one
(``http://trk:5000``) and the offline AzureML front (``azureml://trk:5443/...``, the real plugin's path). Each job
gets fresh node directories holding a copy of the code (the workers), as AzureML copies the code snapshot to each
node's disk.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.cluster import REPO, Cluster
from tests.support.environment import clean_environment
from tests.support.tracking_host import TrackingHost

WORKERS = REPO / "tests" / "workers"
# What every rank of a test job gets (mpirun -x), besides the job's MLflow variables.
TEST_VARIABLES = {
    "HVD_MLFLOW_TESTING": "1",
    "HVD_MLFLOW_LOG_MODELS": "0",
    "HVD_MLFLOW_CHECK_DIVERGENCE": "0",  # each rank trains on its own (fit_worker.py)
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "PYTHONUNBUFFERED": "1",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30",
}
# this machine's, to every rank; PYTHONPATH: the test session's start-up module (tests/support/startup)
PASSED_ON = ("TF_USE_LEGACY_KERAS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "PYTHONPATH")


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
        self.fronts = {name: TrackingHost(self.cluster, folder / "trk", name) for name in ("plain", "azureml")}
        self._environment = clean_environment()
        self._jobs = 0

    # -- life cycle ------------------------------------------------------------------------------------
    def up(self) -> Bed:
        self.cluster.up()
        try:
            for front in self.fronts.values():
                front.start()
            for front in self.fronts.values():
                front.wait_ready()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        for front in self.fronts.values():
            front.stop()
        self.cluster.down()

    # -- the tracking host ---------------------------------------------------------------------------------
    def tracking_uri(self, front: str = "plain") -> str:
        return self.fronts[front].tracking_uri

    def store(self, front: str = "plain"):
        return self.fronts[front].store()

    def seen(self, front: str = "plain") -> dict[str, Any]:
        return self.fronts[front].seen()

    def job_run(self, experiment: str, front: str = "plain") -> tuple[str, str, dict[str, str]]:
        return self.fronts[front].job_run(experiment)

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
        return self.launch([sys.executable, worker, "--out", ".", *args], env, ranks_per_node)

    def launch(self, argv: list[str], env: dict[str, str], ranks_per_node: int = 2):
        """Start ``argv`` on every node with mpirun from node 0, in fresh node directories."""
        self._jobs += 1
        nodes = self.fresh_nodes()
        variables = {**TEST_VARIABLES, **{k: os.environ[k] for k in PASSED_ON if k in os.environ}, **env}
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

    def kill_jobs(self) -> None:
        """Every process on the nodes (a job a failed test left running), before the next test."""
        for host in self.cluster.nodes:
            self.cluster.kill(host.name)

    def on_node(self, node: str, argv: list[str], env: dict[str, str], timeout: float = 300):
        """``argv`` on ``node``, in its working directory (e.g. ``hvd-mlflow sync`` after the job)."""
        done = subprocess.run([str(self.cluster.enter), node, *argv], env={**self._environment, **env},
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
        return done
