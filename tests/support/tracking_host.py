"""The tracking host of the multi-node test bed (tests/support/cluster.py), run inside its namespace.

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
import sys
import threading
from pathlib import Path
from typing import Any

from tests.support.azureml_front import AzureMLFront
from tests.support.mlflow_server import MlflowServer
from tests.support.proxy import Proxy


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
