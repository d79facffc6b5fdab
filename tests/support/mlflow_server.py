"""A real ``mlflow server`` (sqlite backend) on 127.0.0.1 at a free port.

The server runs in a process group of its own (``mlflow server`` starts gunicorn or uvicorn, whose master starts
workers): :meth:`MlflowServer.stop` ends the whole group, so no worker outlives the test that started it (seen before:
the oldest row's gunicorn master and worker still running an hour after the suite, their parent gone).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, wait: float = 120.0) -> MlflowServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "server.log", "ab")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "mlflow", "server",
                "--backend-store-uri", f"sqlite:///{self.workdir / 'mlflow.db'}",
                "--artifacts-destination", str(self.workdir / "artifacts"),
                "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
            ],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
            env={**os.environ, "MLFLOW_TRACKING_URI": ""}, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.workdir / 'server.log').read_text()[-3000:]}")
            if self.healthy():
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer /health within {wait} s")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """End the server's whole process group (TERM, then KILL after 20 s), its workers included."""
        if self.process is None:
            return
        group = self.process.pid  # start_new_session: the group's id is the server's pid
        for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            if not _group_alive(group):
                break
            time.sleep(0.2)  # the master ended before its workers: give them a moment, then KILL what is left
        self.process.poll()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
