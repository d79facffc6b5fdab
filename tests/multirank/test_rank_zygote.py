"""The suite's rank zygotes (tests/support/rank_zygote.py): a forked rank is what a fresh ``python worker.py`` is
(but for the zygote's frozen import-time objects, which rank_zygote.py's docstring names).

Each check compares with what the launcher and the client see from outside (pids, /proc, the exit status, the
output horovodrun collected), not with what the zygote says of itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import horovodrun, rank_zygote
from tests.support.environment import clean_environment

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.multirank, pytest.mark.once, pytest.mark.timeout(300)]

PROBE = r"""
import sys
tf_before_import = "tensorflow" in sys.modules
import json, os, time
import numpy as np
import tensorflow as tf  # already imported in a zygote: costs nothing there
rank = int(os.environ["HOROVOD_RANK"])
cmdline = open("/proc/self/cmdline", "rb").read().split(b"\0")
json.dump({
    "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "cwd": os.getcwd(), "argv": sys.argv,
    "job_var": os.environ.get("JOB_VAR"), "folder_var": os.environ.get(%(folder)r),
    "zygote_cmdline": any(part.endswith(b"rank_zygote.py") for part in cmdline),
    "tf_before_import": tf_before_import, "hash": hash("a set of names"), "numpy": float(np.random.random()),
    "mlflow_loaded": "mlflow" in sys.modules, "main_file": __file__,
}, open(f"probe{rank}.json", "w"))
print(f"rank {rank} says hello on stdout")
print(f"rank {rank} says hello on stderr", file=sys.stderr)
if "--sleep" in sys.argv and rank == 1:
    time.sleep(120)
sys.exit(int(sys.argv[sys.argv.index("--exit") + 1]) if rank == 1 and "--exit" in sys.argv else 0)
"""


@pytest.fixture(scope="module")
def zygotes():
    made = rank_zygote.RankZygotes()
    yield made
    made.close()


def job(tmp_path, zygotes, *args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, list[dict]]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE % {"folder": rank_zygote.FOLDER_ENV})
    env = {**clean_environment(), **horovodrun.env(), "JOB_VAR": "the job's own", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.update(zygotes.env_for(env, 2))
    command = [*horovodrun.command(), "-np", "2", "-H", "localhost:2", "--gloo", *zygotes.command(), str(script),
               *args]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    probes = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("probe[0-9].json"))]
    return done, probes


def test_a_forked_rank_has_its_own_process_environment_streams_and_seeds(tmp_path, zygotes):
    done, probes = job(tmp_path, zygotes, "--flag")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(probes) == 2
    for rank, probe in enumerate(probes):
        assert probe["zygote_cmdline"]  # really forked from a zygote (not the client's fallback to a plain python)
        assert probe["tf_before_import"]  # TensorFlow came with the fork
        assert probe["sid"] == probe["pid"]  # a session of its own
        assert probe["cwd"] == str(tmp_path) and probe["argv"] == [str(tmp_path / "probe.py"), "--flag"]
        assert probe["main_file"] == str(tmp_path / "probe.py")
        assert probe["job_var"] == "the job's own" and probe["folder_var"] is None
        assert not probe["mlflow_loaded"]  # the zygote imports TensorFlow and Horovod only
        assert f"rank {rank} says hello on stdout" in done.stdout  # through horovodrun's own pipes
        assert f"rank {rank} says hello on stderr" in done.stderr
    assert probes[0]["hash"] != probes[1]["hash"]  # each rank's zygote its own hash seed, as fresh interpreters
    assert probes[0]["numpy"] != probes[1]["numpy"]
    again, reprobes = job(tmp_path, zygotes)
    assert again.returncode == 0
    assert [p["numpy"] for p in reprobes] != [p["numpy"] for p in probes]  # drawn anew for every rank process
    assert {p["pid"] for p in reprobes}.isdisjoint(p["pid"] for p in probes)


def test_a_rank_s_exit_code_reaches_the_launcher(tmp_path, zygotes):
    done, _ = job(tmp_path, zygotes, "--exit", "3")
    assert done.returncode != 0
    assert "Exit code: 3" in done.stdout + done.stderr


def sleeping_rank(tmp_path, zygotes) -> tuple[subprocess.Popen, int]:
    """A client as the launcher starts it for rank 1, whose rank sleeps; the client and the rank's pid."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE % {"folder": rank_zygote.FOLDER_ENV})
    env = {**clean_environment(), "HOROVOD_RANK": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.update(zygotes.env_for(env, 2))
    client = subprocess.Popen([*zygotes.command(), str(script), "--sleep"], env=env, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not (tmp_path / "probe1.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)  # the probe's file is written in one call; let it close
    rank = json.loads((tmp_path / "probe1.json").read_text())["pid"]
    assert rank != client.pid and _alive(rank)
    return client, rank


def test_a_killed_client_takes_its_rank_with_it(tmp_path, zygotes):
    """horovodrun ends a failed job by signalling each rank's process group; the SIGKILL it may end with reaches the
    client only: the rank, forked elsewhere, must end with it."""
    client, rank = sleeping_rank(tmp_path, zygotes)
    client.send_signal(signal.SIGKILL)
    client.wait(10)
    deadline = time.monotonic() + 10
    while _alive(rank) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(rank)


def test_a_signal_to_the_client_reaches_the_rank_and_the_client_ends_as_the_rank_did(tmp_path, zygotes):
    client, rank = sleeping_rank(tmp_path, zygotes)
    client.send_signal(signal.SIGTERM)
    assert client.wait(10) == -signal.SIGTERM  # the rank died of SIGTERM (Python's default): so does the client
    assert not _alive(rank)


def test_zygotes_end_with_a_session_that_ends_without_its_atexit_hooks(tmp_path):
    """An xdist worker may end with os._exit (execnet, when its session does not end in time): its zygotes, left
    behind, outlived a CI run."""
    env = {**clean_environment(), "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, "-c", SESSION_WITHOUT_ATEXIT]
    with open(tmp_path / "stderr", "w") as stderr:  # a pipe would be held open by zygotes left behind
        session = subprocess.run(command, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT, env=env,
                                 timeout=120)  # fmt: skip
    assert session.returncode == 0, (tmp_path / "stderr").read_text()
    zygotes = json.loads(session.stdout)
    assert len(zygotes) == 2 and all(isinstance(pid, int) for pid in zygotes)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in zygotes) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in zygotes if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []


SESSION_WITHOUT_ATEXIT = """
import json, os
from tests.support import rank_zygote
zygotes = rank_zygote.RankZygotes()
zygotes.env_for(dict(os.environ), 2)  # started and ready
print(json.dumps([process.pid for process in zygotes._processes]), flush=True)
os._exit(0)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


ALONE_PROBE = r"""
import atexit, json, os, sys, weakref


class Callback:
    pass


def fit():
    callback = Callback()  # held by this frame only, as a fit's callbacks are by Keras' frames
    alive = weakref.ref(callback)
    cmdline = open("/proc/self/cmdline", "rb").read().split(b"\0")
    atexit.register(lambda: json.dump({
        "callback_alive_at_exit": alive() is not None,
        "zygote_cmdline": any(part.endswith(b"rank_zygote.py") for part in cmdline),
        "horovod_vars": sorted(k for k in os.environ if k.startswith("HOROVOD_")),
        "zygote_vars": sorted(k for k in os.environ if k.startswith("HVD_MLFLOW_TEST_RANK_ZYGOTE")),
        "argv": sys.argv, "cwd": os.getcwd(),
    }, open("alone.json", "w")))
    raise RuntimeError("boom in fit")


fit()
"""


def test_one_process_without_a_launcher_ends_on_an_uncaught_error_as_python_does(tmp_path, monkeypatch):
    """tests/support/launch.py's one process without a launcher (``launch.python``), forked from rank 0's zygote,
    against the same script run by ``python`` (the truth): exit 1, the traceback on stderr, no Horovod or zygote
    variable, and what the error's frames hold still alive when the atexit hooks run (python keeps the error in
    ``sys.last_*`` until after them: an exit hook sees the fit's callbacks). The zygote freed the traceback first."""
    from tests.support import launch

    monkeypatch.setenv(rank_zygote.ENABLE_ENV, "1")
    seen = {}
    for how in ("python", "zygote"):
        folder = tmp_path / how
        folder.mkdir()
        script = folder / "probe.py"
        script.write_text(ALONE_PROBE)
        env = {**clean_environment(), "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
        command = [sys.executable] if how == "python" else launch.python(env)
        done = subprocess.run([*command, str(script)], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert done.returncode == 1, (how, done.stdout + done.stderr)
        assert "Traceback (most recent call last)" in done.stderr and "RuntimeError: boom in fit" in done.stderr
        seen[how] = json.loads((folder / "alone.json").read_text())
    assert seen["zygote"]["zygote_cmdline"] and not seen["python"]["zygote_cmdline"]  # really forked
    for key in ("callback_alive_at_exit", "horovod_vars", "zygote_vars"):
        assert seen["zygote"][key] == seen["python"][key], (key, seen)
    assert seen["python"]["callback_alive_at_exit"] is True and seen["zygote"]["horovod_vars"] == []
    assert seen["zygote"]["argv"] == [str(tmp_path / "zygote" / "probe.py")]
    assert seen["zygote"]["cwd"] == str(tmp_path / "zygote")
