"""Run the test worker under ``horovodrun --gloo`` on localhost (real ranks), or as one plain process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support import horovodrun as launcher
from tests.support import rank_zygote
from tests.support.environment import clean_environment

WORKER = Path(__file__).resolve().parent.parent / "workers" / "fit_worker.py"
BIN = Path(sys.executable).parent


@dataclass
class Launch:
    returncode: int
    output: str
    seconds: float
    out_dir: Path

    def rank(self, r: int) -> dict:
        return json.loads((self.out_dir / f"rank{r}.json").read_text())

    def check(self) -> Launch:
        assert self.returncode == 0, f"workers failed (exit {self.returncode}):\n{self.output[-8000:]}"
        return self


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = clean_environment()
    env.update(
        HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="30",
        HOROVOD_GLOO_TIMEOUT_SECONDS="60",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONUNBUFFERED="1",
        HVD_MLFLOW_TESTING="1",  # rank 0's guard re-raises (the fault-injection tests turn it off)
        HVD_MLFLOW_LOG_MODELS="0",  # the model tests turn it on; saving a model costs seconds per launch
    )
    env.update(extra or {})
    return env


def prestart_rank_zygotes() -> None:
    """Start the rank zygotes of a usual job's environment now, if they are on (the session's start calls this)."""
    if rank_zygote.enabled():
        rank_zygote.session().prestart(_env(None))


def python(env: dict[str, str]) -> list[str]:
    """What runs a ``.py`` script as one process without a launcher: ``python``, or, with the rank zygotes on, their
    client, whose process is then forked from rank 0's zygote (``env`` gains what that needs)."""
    if not rank_zygote.enabled():
        return [sys.executable]
    env.update(rank_zygote.session().env_for(env, 1), **{rank_zygote.ALONE_ENV: "1"})
    return rank_zygote.session().command()


def run(
    out_dir: Path,
    args: list[str] | None = None,
    *,
    np: int = 2,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    horovodrun: bool = True,
    installed_horovodrun: bool = False,
    worker: Path = WORKER,
) -> Launch:
    """Run ``worker`` with ``np`` ranks (``horovodrun=False``: one process, no launcher).

    The ranks are started by Horovod's launcher with the session's answer to how Horovod was built
    (tests/support/horovodrun.py), or by the installed ``horovodrun`` command as a user runs it
    (``installed_horovodrun=True``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(worker), "--out", str(out_dir), *(args or [])]
    env = _env(env)
    if horovodrun:
        if installed_horovodrun:
            program = [str(BIN / "horovodrun")]
        else:
            program = launcher.command()
            env.update(launcher.env())
        if rank_zygote.enabled():  # opt-in: each rank forked from an interpreter that imported TensorFlow once
            env.update(rank_zygote.session().env_for(env, np))
            command = [*rank_zygote.session().command(), *command[1:]]
            if np > rank_zygote.RankZygotes.RANKS:
                # the forked ranks reach Gloo's rendezvous at once and wait there for the plain ones' imports: 8
                # ranks' imports on 2 cores took over the usual 60 s in CI (ranks 0 and 1 gave up waiting for rank 2)
                env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(max(int(env["HOROVOD_GLOO_TIMEOUT_SECONDS"]), 30 * np))
        command = [*program, "-np", str(np), "-H", f"localhost:{np}", "--gloo", *command]
    else:
        command = [*python(env), *command[1:]]
    start = time.monotonic()
    try:
        done = subprocess.run(command, env=env, cwd=out_dir, capture_output=True, text=True, timeout=timeout)
        returncode, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        returncode = -9
        output = f"TIMEOUT after {timeout} s\n{expired.stdout or ''}{expired.stderr or ''}"
    (out_dir / "output.log").write_text(output)
    return Launch(returncode, output, time.monotonic() - start, out_dir)
