"""The tracking host of the multi-node test bed (tests/support/cluster.py): :class:`TrackingHost` starts this module
inside the host's namespace and talks to it.

    python -m tests.support.tracking_host FOLDER NAME ADDRESS PORT [--azureml]

A real ``mlflow server`` listens on this host's loopback only; the nodes reach it through a recording front on the
host's own ADDRESS:PORT, by the host's NAME: a plain proxy (tests/support/proxy.py), or with ``--azureml`` the offline
AzureML front (tests/support/azureml_front.py) with a certificate for NAME.

It writes FOLDER/ready.json once it answers (the tracking URI), FOLDER/seen.json (every TCP connection's peer
address, every request, what the AzureML front rejected) on SIGUSR1 and when it stops (SIGTERM), and on SIGUSR2 makes
the experiment named in FOLDER/job-request.json and a run in it, as AzureML's control plane does before a job, and
writes FOLDER/job.json (the run, the experiment and the job's variables). The server's store is
FOLDER/server/mlflow.db: the test reads the truth from it.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.azureml_front import AzureMLFront
from tests.support.cluster import Cluster
from tests.support.environment import clean_environment
from tests.support.mlflow_server import MlflowServer
from tests.support.proxy import Proxy


class TrackingHost:
    """One front (``plain``: ``http://trk:5000``; ``azureml``: ``azureml://trk:5443/...``) and its real server,
    started on the cluster's ``trk`` host; what it recorded, the runs it holds, a job's run made on it."""

    PORTS = {"plain": 5000, "azureml": 5443}

    def __init__(self, cluster: Cluster, folder: Path, front: str = "plain") -> None:
        self.cluster, self.folder, self.front = cluster, folder / front, front
        self.process: subprocess.Popen | None = None

    def start(self) -> TrackingHost:
        self.folder.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "tests.support.tracking_host", str(self.folder), "trk",
                self.cluster.hosts["trk"].address, str(self.PORTS[self.front])]  # fmt: skip
        if self.front == "azureml":
            argv.append("--azureml")
        log = self.folder / "host.log"
        self.process = self.cluster.popen("trk", argv, clean_environment(), log)
        return self

    def wait_ready(self, timeout: float = 150) -> TrackingHost:
        deadline = time.monotonic() + timeout
        while not (self.folder / "ready.json").exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {self.front} tracking host did not start:\n"
                                   + (self.folder / "host.log").read_text()[-3000:])  # fmt: skip
            time.sleep(0.3)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()

    @property
    def _proc(self) -> subprocess.Popen:
        assert self.process is not None, "start() first"
        return self.process

    @property
    def tracking_uri(self) -> str:
        return json.loads((self.folder / "ready.json").read_text())["tracking_uri"]

    def store(self):
        """The server's own store, read directly: the truth of what the server holds."""
        from mlflow import MlflowClient

        return MlflowClient(f"sqlite:///{self.folder / 'server' / 'mlflow.db'}")

    def seen(self) -> dict[str, Any]:
        """What the front recorded so far: every connection's peer address, every request, what it rejected."""
        path = self.folder / "seen.json"
        before = path.stat().st_mtime_ns if path.exists() else 0
        self._proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while (not path.exists() or path.stat().st_mtime_ns == before) and time.monotonic() < deadline:
            time.sleep(0.05)
        return json.loads(path.read_text())

    def job_run(self, experiment: str) -> tuple[str, str, dict[str, str]]:
        """What AzureML's control plane makes before a job: (run id, experiment id, the job's MLflow variables)."""
        (self.folder / "job-request.json").write_text(json.dumps({"experiment": experiment}))
        self._proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 120  # two requests to the server; slow when the 2 cores are busy
        while time.monotonic() < deadline:
            made = json.loads((self.folder / "job.json").read_text()) if (self.folder / "job.json").exists() else {}
            if made.get("experiment") == experiment:
                return made["run_id"], made["experiment_id"], made["job_environment"]
            time.sleep(0.1)
        raise RuntimeError(f"the tracking host made no run for {experiment}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("name")
    parser.add_argument("address")
    parser.add_argument("port", type=int)
    parser.add_argument("--azureml", action="store_true", help="be the offline AzureML front")
    args = parser.parse_args()
    server = MlflowServer(args.folder / "server").start()
    if args.azureml:
        front: Proxy = AzureMLFront(server.url, args.folder / "tls", host=args.name, address=args.address,
                                    port=args.port)  # fmt: skip
        tracking_uri = front.tracking_uri  # type: ignore[attr-defined]
    else:
        front = Proxy(server.url, host=args.address, port=args.port)
        tracking_uri = f"http://{args.name}:{front.port}"
    front.__enter__()
    ready: dict[str, Any] = {"tracking_uri": tracking_uri, "server": server.url}
    lock = threading.Lock()

    def make_job(*_: object) -> None:
        experiment = json.loads((args.folder / "job-request.json").read_text())["experiment"]
        _write(args.folder / "job.json", _create_job_run(server.url, front, experiment, tracking_uri))

    def dump(*_: object) -> None:
        with lock:
            _write(args.folder / "seen.json", _seen(front))

    def stop(*_: object) -> None:
        dump()
        front.stop()
        server.stop()
        sys.exit(0)

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, make_job)
    signal.signal(signal.SIGTERM, stop)
    _write(args.folder / "ready.json", ready)
    while True:
        signal.pause()


def _create_job_run(server_url: str, front: Proxy, experiment: str, tracking_uri: str) -> dict[str, Any]:
    from mlflow import MlflowClient

    client = MlflowClient(server_url)
    if isinstance(front, AzureMLFront):
        experiment_id = client.create_experiment(experiment, artifact_location=front.artifact_location(experiment))
        run_id = client.create_run(experiment_id).info.run_id
        environment = front.job_environment(run_id, experiment_id)
    else:
        experiment_id = client.create_experiment(experiment)
        run_id = client.create_run(experiment_id).info.run_id
        environment = {"MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_RUN_ID": run_id,
                       "MLFLOW_EXPERIMENT_ID": experiment_id}  # fmt: skip
    return {"experiment": experiment, "run_id": run_id, "experiment_id": experiment_id,
            "job_environment": environment}  # fmt: skip


def _seen(front: Proxy) -> dict[str, Any]:
    with front._lock:
        requests = [
            {"method": r.method, "path": r.path, "client": r.client, "status": r.status,
             "metrics": [[m["key"], int(m["step"])] for m in r.metrics]}
            for r in front.requests
        ]  # fmt: skip
        rejected = getattr(front, "rejected", [])
        return {"connections": list(front.connections), "requests": requests, "rejected": rejected}


def _write(path: Path, value: dict[str, Any]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(value))
    partial.replace(path)


if __name__ == "__main__":
    main()
