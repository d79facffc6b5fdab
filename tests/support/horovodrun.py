"""``horovodrun`` for the suite's jobs, without the one cost that is the same in every job: asking Horovod's build.

Every ``horovodrun`` asks whether Horovod was built with Gloo (``--gloo``, elastic) or MPI:
``horovod.common.util.gloo_built()`` forks a child that imports horovod.tensorflow, that is all of TensorFlow.
That is 3-8 s of every job here (TF 2.16: 3.1 s; TF 2.18 + Keras 3.15: 7.7 s), more than the training of most
tests. The answer cannot change within one test session (the row's Horovod is the same), so the session asks
Horovod once, in a child process of its own (:func:`built`), and each job runs Horovod's
own launcher (``horovod.runner.launch.run_commandline``, the code ``horovodrun`` runs) with that answer::

    subprocess.run([*horovodrun.command(), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "train.py"],
                   env={**os.environ, **horovodrun.env()})

The rest of the launch is Horovod's, unchanged: its argument parsing, its Gloo rendezvous, its task services, its
elastic driver, its exit codes. The installed ``horovodrun`` itself is what one test runs on purpose
(``tests/multirank/test_global_metrics.py``, the README's command), and ``scripts/run-example.sh``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

BUILT_ENV = "HVD_MLFLOW_TEST_HOROVOD_BUILT"  # Horovod's answers, as JSON: {"gloo": bool, "mpi": bool}
# What horovod.common.util's gloo_built() and mpi_built() ask, in a child of their own each: the first extension in
# its EXTENSIONS list, horovod.tensorflow, and its gloo_built() / mpi_built(). Asked here in one child for both.
_ASK = (
    "import json; import horovod.tensorflow as ext; "
    "print(json.dumps({'gloo': bool(ext.gloo_built()), 'mpi': bool(ext.mpi_built())}))"
)


@functools.cache
def built() -> str:
    """Horovod's own answers for this interpreter's Horovod (asked once per session, in a child process)."""
    done = subprocess.run([sys.executable, "-c", _ASK], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"asking Horovod how it was built failed:\n{done.stderr[-4000:]}")
    return done.stdout.strip().splitlines()[-1]


def env() -> dict[str, str]:
    """The environment a job launched with :func:`command` needs (add it to the job's own)."""
    return {BUILT_ENV: built()}


def command() -> list[str]:
    """The command line that stands for ``horovodrun`` (Horovod's launcher in this interpreter)."""
    return [sys.executable, str(Path(__file__).resolve())]


def _main() -> int:
    sys.path.pop(0)  # this file's folder: not a place to import from (its modules' names are not the packages')
    if BUILT_ENV not in os.environ:
        print(f"{__file__}: {BUILT_ENV} is not set (tests.support.horovodrun.env() gives it)", file=sys.stderr)
        return 2
    answers = json.loads(os.environ[BUILT_ENV])
    from horovod.runner import launch  # Horovod's launcher; its build checks are imported into it by name

    launch.gloo_built = lambda verbose=False: answers["gloo"]
    launch.mpi_built = lambda verbose=False: answers["mpi"]
    launch.run_commandline()
    return 0


if __name__ == "__main__":  # Horovod's launcher starts processes with multiprocessing's spawn: import-safe only so
    sys.exit(_main())
