"""Run Python scripts each in a fresh process, without paying TensorFlow's import for each one.

A zygote is one interpreter that has imported the modules every script imports first (TensorFlow, Keras, Horovod's
``horovod.tensorflow``, NumPy) and nothing else: nothing initialised, no TensorFlow op run (the threads these imports
start, OpenBLAS' pool and jemalloc's, have fork handlers). Each
script runs in a child forked from it, as its own process: its own working directory, environment, stdout/stderr,
``__main__``, exit code, and a normal interpreter exit (threads joined, ``atexit`` hooks run). What a child does
(``hvd.init()``, ``hvd_mlflow.autolog()``, MLflow's import) cannot reach the next one. Only the modules' import
itself is shared (with what the zygote did to it: the freeze, FROZEN below; tests/support/startup's rule), so a script
that needs an environment variable read at TensorFlow's import must not run here.

    with Zygote(env) as zygote:
        code, output = zygote.run(script, cwd=workdir, env=env, timeout=900)
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

PRELOAD = ("numpy", "tensorflow", "horovod.tensorflow")
# FROZEN: a zygote freezes what its imports made (gc.freeze(), as Python's docs advise before fork() without exec()).
# Test speed only: a process that imported TensorFlow spends ~0.8 s of its exit in the interpreter's final garbage
# collections, traversing TensorFlow's objects, which no process frees before it ends anyway; a forked process skips
# them (0.09 s). What the process itself makes (hvd-mlflow's objects, the model) is collected as in any process.

SERVER = r"""
import gc, importlib, json, os, runpy, sys

protocol_in, protocol_out = os.fdopen(os.dup(0), "r"), os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # what the imports print goes to stderr, not into the protocol
for name in sys.argv[1:]:
    importlib.import_module(name)
import tensorflow as tf
tf.keras.Model  # the Keras flavour (TF_USE_LEGACY_KERAS) is resolved once, as at a script's first use
gc.freeze()  # what the imports made (FROZEN in zygote.py)
print(json.dumps({"ready": True}), file=protocol_out, flush=True)
for line in protocol_in:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:  # the child: a process of its own from here on; it never returns to this loop
        protocol_in.close(); protocol_out.close()
        os.setsid()
        os.chdir(request["cwd"])
        os.environ.clear(); os.environ.update(request["env"])
        out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1); os.dup2(out, 2); os.close(out)
        stdin = os.open(os.devnull, os.O_RDONLY); os.dup2(stdin, 0); os.close(stdin)
        sys.argv = [request["script"]]
        sys.path[0] = os.path.dirname(request["script"])
        code = 0
        try:
            runpy.run_path(request["script"], run_name="__main__")
        except SystemExit as exit_:
            code = exit_.code
        except BaseException:  # as python ends on it: printed by sys.excepthook, kept until after the atexit hooks
            sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
            sys.excepthook(*sys.exc_info())
            code = 1
        sys.exit(code)  # the interpreter's own exit: threads joined, atexit hooks, flushed streams
    print(json.dumps({"pid": pid}), file=protocol_out, flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), file=protocol_out, flush=True)
"""


class Zygote:
    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = PRELOAD) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", SERVER, *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self._pending = b""  # what was read from the zygote beyond the last whole line
        self._child: int | None = None
        ready = self._read(timeout=300)
        assert ready == {"ready": True}, ready

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, timeout: float) -> dict | None:
        """The zygote's next line, read off the pipe itself (no buffer of Python's between it and ``select``)."""
        assert self._process.stdout is not None
        fd = self._process.stdout.fileno()
        end = time.monotonic() + max(0.0, timeout)
        while b"\n" not in self._pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the zygote ended (exit {self._process.wait()})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, script: Path, cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
        """Run ``script`` in a fresh child; its exit code (``-9`` after ``timeout``) and its output."""
        assert self._process.stdin is not None
        output = cwd / f"{script.stem}.output"
        request = {"script": str(script), "cwd": str(cwd), "env": env, "output": str(output)}
        self._process.stdin.write((json.dumps(request) + "\n").encode())
        self._process.stdin.flush()
        started = time.monotonic()
        started_child = self._read(timeout=60)
        assert started_child is not None, "the zygote did not fork"
        self._child = started_child["pid"]
        try:
            answer = self._read(timeout=timeout - (time.monotonic() - started))
            if answer is None:  # hung: end the child's whole session (what it started too); the zygote reaps it
                self._kill_child()
                self._read(timeout=30)
                return -9, f"TIMEOUT after {timeout} s\n{output.read_text(errors='replace')}"
            return answer["status"], output.read_text(errors="replace")
        finally:
            self._child = None

    def _kill_child(self) -> None:
        if self._child is not None:
            try:
                os.killpg(self._child, signal.SIGKILL)  # the child's own session (os.setsid)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        self._kill_child()  # a child still running (the test was stopped in it) is not in the zygote's group
        if self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
