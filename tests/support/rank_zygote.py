"""Horovod ranks and tf.distribute workers forked from interpreters that imported TensorFlow once, instead of
importing it in every job.

Opt-in (``HVD_MLFLOW_TEST_RANK_ZYGOTE=1`` in the test session's environment): every multi-rank job of the suite
imports TensorFlow, Keras and ``horovod.tensorflow`` in each rank (3-5 s of CPU a rank here), which is most of a
short job. With this on, a job's ranks are still started by Horovod's launcher (tf.distribute's workers by
tests/support/tf_workers.py), one process each, but the process the launcher starts is a small client (this file,
run as a script, without TensorFlow) that asks a zygote to fork the rank: an interpreter that imported those modules
(those installed: no Horovod in the tf.distribute row) and nothing else, nothing initialised. A rank is Horovod's
``HOROVOD_RANK``, or a tf.distribute task's place in ``TF_CONFIG`` (the chief first). There is one zygote per
rank index below :attr:`RankZygotes.RANKS` (each with its own ``PYTHONHASHSEED`` draw, so two ranks still iterate a
set of names in different orders, as two fresh interpreters do) and per set of the environment variables read at
TensorFlow's import (:data:`IMPORT_TIME`: a job that sets another ``TF_USE_LEGACY_KERAS`` gets zygotes of its own).

What the rank is, as in a fresh process: its own pid and session, the client's working directory, environment,
stdin/stdout/stderr (passed over the socket), ``sys.argv``, ``__main__``, NumPy's global generator seeded anew, a
normal interpreter exit (threads joined, ``atexit`` hooks run), and its exit code or signal, which the client
exits with. A signal the launcher sends the client (horovodrun ends a job with SIGTERM, then SIGKILL) goes to the
rank's session; a client that dies (SIGKILL) takes the rank with it. Anything the client cannot hand over (no
zygote for its rank, a script that is not a ``.py`` file, an environment whose import-time variables differ from
the zygote's) runs as a plain ``python`` process instead (``os.execv``), as without this module. Unlike a fresh
process, what the zygote's imports made is frozen (``gc.freeze()``, tests/support/zygote.py): a rank's full
collections do not traverse TensorFlow's objects, and its exit skips ~0.8 s of collecting them (the benchmarks,
plain processes, measure what users get).

    zygotes = RankZygotes()
    env = {**job_env, **zygotes.env_for(job_env, np=2)}
    command = [*horovodrun, "-np", "2", *zygotes.command(), "worker.py", "--out", "out"]
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import NoReturn

ENABLE_ENV = "HVD_MLFLOW_TEST_RANK_ZYGOTE"  # "1" in the test session: ranks are forked from zygotes
FOLDER_ENV = "HVD_MLFLOW_TEST_RANK_ZYGOTES"  # in a job's environment: the folder of its zygotes' sockets
ALONE_ENV = "HVD_MLFLOW_TEST_RANK_ZYGOTE_ALONE"  # "1": one process without a launcher, served by rank 0's zygote
IMPORT_TIME = ("TF_", "KERAS_", "OMP_", "MKL_", "OPENBLAS_", "CUDA_", "XLA_", "PYTHON", "LD_")
NOT_IMPORT_TIME = ("TF_CONFIG",)  # read when a strategy is made, not at the import: one zygote serves every task
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
HERE = Path(__file__).resolve()


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV) == "1"


def _own(env: dict[str, str]) -> dict[str, str]:
    """A process's environment without the zygotes' folder (what neither a zygote nor a rank should inherit)."""
    return {k: v for k, v in env.items() if k not in (FOLDER_ENV, ALONE_ENV)}


def import_time_key(env: dict[str, str]) -> str:
    """The environment variables a process reads at TensorFlow's import (a zygote serves only the same ones)."""
    return json.dumps(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in NOT_IMPORT_TIME))


# -- the test session's side: one zygote per (rank index, import-time environment) -------------------------------


class RankZygotes:
    """The zygotes of one test session; ended with it, each with its whole process group: by ``atexit``, or, for a
    session that ends without its atexit hooks, by the zygote itself when its stdin's pipe from the session closes.

    Zygotes serve ranks 0 and 1 (:attr:`RANKS`), what nearly every job of the suite has: a rank beyond them (the
    8-rank golden case) runs as a plain process, which costs that job nothing more than without zygotes, where
    zygotes of its own would cost it their start. :meth:`prestart` starts the usual environment's zygotes at the
    session's start, so that their import overlaps the first tests instead of delaying the first job.
    """

    RANKS = 2

    def __init__(self) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="hvd-mlflow-rank-zygotes-"))
        self._folders: dict[str, Path] = {}
        self._processes: list[subprocess.Popen] = []
        self._starting: dict[Path, subprocess.Popen] = {}  # started, their "ready" not read yet
        self._lock = threading.Lock()
        atexit.register(self.close)

    def command(self) -> list[str]:
        """What the launcher runs instead of ``python``: the client (followed by the script and its arguments)."""
        return [sys.executable, str(HERE)]

    def prestart(self, env: dict[str, str]) -> None:
        """Start the zygotes of this environment's ranks without waiting for them (the first job waits, if need be)."""
        with self._lock:
            self._start_missing(env, self.RANKS)

    def env_for(self, env: dict[str, str], np: int) -> dict[str, str]:
        """The variables a job with this environment and ``np`` ranks adds, its zygotes started if need be."""
        with self._lock:
            folder = self._start_missing(env, min(np, self.RANKS))
            for path in [path for path in self._starting if path.parent == folder]:  # side by side: imports overlap
                process = self._starting.pop(path)
                ready = process.stdout.readline() if process.stdout else b""
                if not ready.startswith(b"ready"):
                    raise RuntimeError(f"a rank zygote did not start (exit {process.wait()})")
        return {FOLDER_ENV: str(folder)}

    def _start_missing(self, env: dict[str, str], ranks: int) -> Path:
        key = import_time_key(env)
        folder = self._folders.setdefault(key, self._root / f"env-{len(self._folders)}")
        folder.mkdir(exist_ok=True)
        for path in (folder / f"rank-{r}.sock" for r in range(ranks)):
            if not path.exists() and path not in self._starting:
                self._starting[path] = self._start(path, env)  # each its own hash seed
        return folder

    def _start(self, path: Path, env: dict[str, str]) -> subprocess.Popen:
        from tests.support.zygote import PRELOAD  # the modules the docs' zygote imports: the same here

        env = _own(env)
        # its stdin: a pipe whose other end only this process holds, so that a session ended without its atexit
        # hooks (os._exit, a signal, an xdist worker's forced exit) still ends its zygotes (:func:`serve`)
        process = subprocess.Popen([sys.executable, str(HERE), "--serve", str(path), *PRELOAD], env=env,
                                   cwd=self._root, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   start_new_session=True)  # fmt: skip
        self._processes.append(process)
        return process

    def close(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)  # the zygote and the managers it forked
                except ProcessLookupError:
                    pass
                process.wait()
        self._processes.clear()


_session: RankZygotes | None = None


def session() -> RankZygotes:
    """This test session's zygotes (made at first use)."""
    global _session
    if _session is None:
        _session = RankZygotes()
    return _session


# -- the wire: a length-prefixed JSON message, the client's three standard streams beside the first one -----------


def _send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(sock, [payload], fds)
    else:
        sock.sendall(payload)


def _receive(sock: socket.socket, with_fds: int = 0) -> tuple[dict | None, list[int]]:
    data, fds = b"", []
    if with_fds:
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, with_fds)
    while len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:
        chunk = sock.recv(1 << 16)
        if not chunk:
            return None, fds
        data += chunk
    return json.loads(data[4 : 4 + struct.unpack("!I", data[:4])[0]]), fds


# -- the zygote: imports once, then forks a manager per client, which forks the rank and reports how it ended -----


def serve(path: Path, preload: list[str]) -> None:
    import gc
    import importlib
    import importlib.util

    for name in preload:
        if importlib.util.find_spec(name.split(".")[0]) is not None:  # horovod: not in the tf.distribute row
            importlib.import_module(name)
    import numpy as np
    import tensorflow as tf

    tf.keras.Model  # noqa: B018 - the Keras flavour (TF_USE_LEGACY_KERAS) resolved once, as at a script's first use
    gc.freeze()  # what the imports made: never traversed by a rank's collections (FROZEN: tests/support/zygote.py)
    own_key = import_time_key(dict(os.environ))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # managers are reaped by the kernel
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):  # the test session is gone, however it ended
            os.killpg(0, signal.SIGKILL)  # this zygote and its managers; their clients then end their ranks
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:  # the manager of this client's rank
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                rank = _manage(conn, own_key)
            except BaseException:  # noqa: BLE001 - the client sees its connection end and ends its rank
                os._exit(1)
            if rank is None:  # the manager's work is done
                os._exit(0)
            # the rank: its script runs at the bottom of this stack, so that its SystemExit is the interpreter's exit
            _become_the_rank(*rank, np.random)
        conn.close()


def _manage(conn: socket.socket, own_key: str) -> tuple[dict, list[int]] | None:
    """Fork the client's rank and report how it ended; in the forked rank, return its request and streams."""
    request, fds = _receive(conn, with_fds=3)
    if request is None or len(fds) != 3:
        return None
    if import_time_key(request["env"]) != own_key:
        _send(conn, {"mismatch": True})
        return None
    pid = os.fork()
    if pid == 0:
        conn.close()
        return request, fds
    for fd in fds:
        os.close(fd)
    _send(conn, {"pid": pid})
    watched = os.pidfd_open(pid)
    while True:
        ready, _, _ = select.select([conn, watched], [], [])
        if watched in ready:
            _, status = os.waitpid(pid, 0)
            _send(conn, {"status": os.waitstatus_to_exitcode(status)})
            return None
        if not conn.recv(1):  # the client is gone (killed): the rank and what it started go with it
            _kill_session(pid)
            os.waitpid(pid, 0)
            return None


def _become_the_rank(request: dict, fds: list[int], numpy_random) -> None:
    import runpy

    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    numpy_random.seed()  # NumPy's global generator drawn anew, as in a fresh process (Python's random is, at fork)
    script = os.path.abspath(request["argv"][0])
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(script)
    code: object = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
    except BaseException:  # noqa: BLE001 - a script's uncaught error, as python ends on one: exit 1, the error
        # printed by sys.excepthook and kept in sys.last_* until the interpreter is finalised, after the atexit hooks
        # (a fit's callbacks, held by the traceback's frames, are still alive when an exit hook runs)
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
        sys.excepthook(*sys.exc_info())
        code = 1
    sys.exit(code)  # the interpreter's own exit: threads joined, atexit hooks, flushed streams


def _kill_session(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)  # the rank's own session (os.setsid): its group's id is its pid
    except (ProcessLookupError, PermissionError):
        pass


# -- the client: what the launcher starts for each rank ----------------------------------------------------------


def rank_of(env: dict[str, str]) -> int | None:
    """The process's rank: Horovod's, or a tf.distribute task's place in its cluster (the chief first), or 0 for one
    process without a launcher (:data:`ALONE_ENV`, which the process itself never sees)."""
    if env.get(ALONE_ENV) == "1":
        return 0
    if "HOROVOD_RANK" in env:
        return int(env["HOROVOD_RANK"])
    if "TF_CONFIG" in env:
        config = json.loads(env["TF_CONFIG"])
        task = config.get("task", {})
        chiefs = len(config.get("cluster", {}).get("chief", []))
        if task.get("type") == "chief":
            return int(task.get("index", 0))
        if task.get("type") == "worker":
            return chiefs + int(task.get("index", 0))
    return None


def client(argv: list[str]) -> int:
    folder, rank = os.environ.get(FOLDER_ENV), rank_of(dict(os.environ))
    path = Path(folder) / f"rank-{rank}.sock" if folder and rank is not None else None
    if path is None or not path.exists() or not argv or not argv[0].endswith(".py"):
        _plain(argv)
    env = _own(dict(os.environ))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(path))
    _send(conn, {"argv": argv, "cwd": os.getcwd(), "env": env}, fds=[0, 1, 2])
    started, _ = _receive(conn)
    if started is None or "pid" not in started:
        conn.close()
        _plain(argv)  # this zygote cannot serve this environment: a plain process
    pid = started["pid"]
    for sig in FORWARDED:  # what the launcher sends this process goes to the rank's session
        signal.signal(sig, lambda sig, _frame: _kill_session(pid, sig))
    ended, _ = _receive(conn)
    if ended is None:  # the manager is gone: nothing would report the rank's end any more
        _kill_session(pid)
        return 1
    status = ended["status"]
    if status < 0:  # ended by a signal: end the same way, so that the launcher sees what it would have seen
        if -status not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


def _plain(argv: list[str]) -> NoReturn:
    os.execve(sys.executable, [sys.executable, *argv], _own(dict(os.environ)))


if __name__ == "__main__":
    # sys.path[0] is the script's folder, this file's: not a place to import from (its modules' names are not the
    # packages' names). A zygote holds its own empty working folder there until a rank's script takes the place.
    if sys.argv[1:2] == ["--serve"]:
        sys.path[0] = os.getcwd()
        serve(Path(sys.argv[2]), sys.argv[3:])
    else:
        sys.path.pop(0)  # the client imports the standard library only
        sys.exit(client(sys.argv[1:]))
