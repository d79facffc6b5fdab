"""Start tf.distribute workers as AzureML's ``distribution: type: tensorflow`` jobs do: one plain process per worker,
each with its own ``TF_CONFIG`` (the cluster on free 127.0.0.1 ports, or the nodes' addresses), no launcher.

With the rank zygotes on (``HVD_MLFLOW_TEST_RANK_ZYGOTE=1``, tests/support/rank_zygote.py), each worker on this host
is forked from an interpreter that imported TensorFlow once; a worker started in a node's namespaces (``prefix``)
is always a plain process of that node. Every worker runs in a process group of its own, with an outer timeout;
whatever happens, every group is ended before :func:`run` returns (a worker left behind would hold its ports and,
with them, the next test's cluster).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tests.support import rank_zygote
from tests.support.launch import Launch, _env
from tests.support.mlflow_server import free_port

WORKER = Path(__file__).resolve().parent.parent / "workers" / "tfd_worker.py"


def cluster(workers: int, chief: bool = False, hosts: Sequence[str] | None = None) -> dict[str, list[str]]:
    """A cluster spec: ``workers`` tasks (the first is the chief task with ``chief``), on free loopback ports or on
    ``hosts`` (one address per task)."""
    addresses = [f"{h}:{free_port() if h == '127.0.0.1' else 23456}" for h in (hosts or ["127.0.0.1"] * workers)]
    if chief:
        return {"chief": addresses[:1], "worker": addresses[1:]}
    return {"worker": addresses}


def tasks(spec: Mapping[str, list[str]]) -> list[tuple[str, int]]:
    """The cluster's training tasks in tf.distribute's order (the chief first): rank r is ``tasks(spec)[r]``."""
    return [("chief", i) for i in range(len(spec.get("chief", [])))] + [
        ("worker", i) for i in range(len(spec.get("worker", [])))
    ]


def tf_config(spec: Mapping[str, list[str]], task: tuple[str, int]) -> str:
    return json.dumps({"cluster": dict(spec), "task": {"type": task[0], "index": task[1]}})


def run(
    out_dir: Path,
    args: Sequence[str] = (),
    *,
    workers: int = 2,
    chief: bool = False,
    env: Mapping[str, str] | None = None,
    per_worker_env: Callable[[int], Mapping[str, str]] | None = None,
    timeout: float = 300,
    worker: Path = WORKER,
    prefix: Callable[[int], list[str]] | None = None,
    spec: Mapping[str, list[str]] | None = None,
) -> Launch:
    """Run ``worker`` as ``workers`` tf.distribute workers (rank r writes ``rank<r>.json`` in ``out_dir``).
    ``per_worker_env(rank)``: more variables for one worker (a tracking server of its own, ...); ``prefix(rank)``: a
    command to start it in (a node's namespaces); ``spec``: the cluster (default: free loopback ports)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = spec or cluster(workers, chief)
    started: list[subprocess.Popen] = []
    logs = [out_dir / f"worker{rank}.log" for rank in range(len(tasks(spec)))]
    python = [sys.executable]
    start = time.monotonic()
    try:
        for rank, task in enumerate(tasks(spec)):
            environment = _env({**(env or {}), **(per_worker_env(rank) if per_worker_env else {})})
            if rank_zygote.enabled() and prefix is None:
                environment.update(rank_zygote.session().env_for(environment, len(tasks(spec))))
                python = rank_zygote.session().command()
            environment["TF_CONFIG"] = tf_config(spec, task)
            command = [*(prefix(rank) if prefix else []), *python, str(worker), "--out", str(out_dir), *args]
            with open(logs[rank], "w") as log:
                started.append(subprocess.Popen(command, env=environment, cwd=out_dir, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip
        codes = _wait(started, start + timeout)
    finally:
        for process in started:
            _end_group(process)
    seconds = time.monotonic() - start
    output = "".join(f"[worker {r}] {line}\n" for r, log in enumerate(logs) for line in log.read_text().splitlines())
    if any(code is None for code in codes):
        output = f"TIMEOUT after {timeout} s\n{output}"
    (out_dir / "output.log").write_text(output)
    returncode = next((c for c in codes if c), 0) if all(c is not None for c in codes) else -9
    return Launch(returncode, output, seconds, out_dir)


def _wait(processes: list[subprocess.Popen], deadline: float) -> list[int | None]:
    """Every process's exit code, ``None`` for one still running at ``deadline``."""
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    return [process.poll() for process in processes]


def _end_group(process: subprocess.Popen) -> None:
    """End ``process``'s whole group (its children too), KILL after 5 s; reap it."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            process.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    if process.poll() is None:
        process.wait()
