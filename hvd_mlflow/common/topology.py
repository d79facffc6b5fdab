"""Where this process stands in the job: rank, world size and local rank.

Horovod is asked when it is initialised; otherwise the launcher's environment is read (Open MPI as AzureML's
MPI jobs use it, PMI, torchrun-style ``RANK``/``WORLD_SIZE``, ``TF_CONFIG``), so the answer is right even
before ``hvd.init()``. Horovod is never imported here: only consulted when the user imported it.

``TF_CONFIG`` (tf.distribute's multi-worker set-up, as AzureML's ``distribution: type: tensorflow`` jobs write it)
ranks the training tasks as tf.distribute itself does (:func:`rank_in_cluster`): the chief first, then the workers,
so rank 0 is the chief, or worker 0 when there is none. The same function ranks the workers of a
MultiWorkerMirroredStrategy (:mod:`hvd_mlflow.every_rank.collectives`): the rank that logs and the rank the guard of
the user's MLflow calls lets write are the same process.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import socket
import sys
from collections.abc import Mapping, Sequence

from ..errors import LauncherMismatchError


@dataclasses.dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    source: str


TRAINING_TASKS = ("chief", "worker")  # the tasks that run fit together under MultiWorkerMirroredStrategy


@dataclasses.dataclass(frozen=True)
class TfCluster:
    """What ``TF_CONFIG`` says of this process."""

    rank: int  # among the training tasks, in tf.distribute's order (chief 0); others (evaluator, ps) rank after them
    size: int  # training tasks: chiefs and workers
    parameter_servers: bool  # a ParameterServerStrategy cluster: only its coordinator (the chief) runs fit


def rank_in_cluster(cluster: Mapping[str, Sequence[object]], task_type: str, index: int) -> int:
    """tf.distribute's own order of a cluster's tasks (``multi_worker_util.id_in_cluster``): the chief is 0, worker
    ``i`` is ``i`` + the number of chiefs; any other task ranks after every training task."""
    chiefs = len(cluster.get("chief", []))
    if task_type == "chief":
        return index
    if task_type == "worker":
        return index + chiefs
    return chiefs + len(cluster.get("worker", [])) + index


def tf_cluster(environ: Mapping[str, str] = os.environ) -> TfCluster | None:
    """This process's place in the cluster ``TF_CONFIG`` describes, or ``None`` without (or with an unreadable)
    ``TF_CONFIG``."""
    if "TF_CONFIG" not in environ:
        return None
    try:
        config = json.loads(environ["TF_CONFIG"])
        cluster = config.get("cluster", {}) or {}
        task = config.get("task", {}) or {}
        task_type = str(task.get("type", "worker"))
        rank = rank_in_cluster(cluster, task_type, int(task.get("index", 0)))
        size = sum(len(cluster.get(kind, [])) for kind in TRAINING_TASKS)
        return TfCluster(rank, max(size, 1), bool(cluster.get("ps")))
    except (ValueError, TypeError, AttributeError):
        return None


def horovod_if_initialised():
    """The ``horovod.tensorflow`` module if the user imported and initialised it, else ``None``."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None:
        return None
    try:
        return hvd if hvd.is_initialized() else None
    except (AttributeError, ValueError):
        return None


def jax_if_initialised():
    """The ``jax`` module if the user imported it and JAX's multi-process runtime is initialised
    (``keras.distribution.initialize()`` / ``jax.distributed.initialize()``) with more than one process, else
    ``None``. JAX is never imported here."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        return jax if jax.distributed.is_initialized() and jax.process_count() > 1 else None
    except Exception:  # noqa: BLE001 - a JAX without that API, or a runtime that failed: not a JAX world
        return None


def current(environ: Mapping[str, str] = os.environ) -> Topology:
    """The topology of this process."""
    hvd = horovod_if_initialised()
    if hvd is not None:
        return Topology(hvd.rank(), hvd.size(), hvd.local_rank(), "horovod")
    jax = jax_if_initialised()
    if jax is not None:  # the launcher's local rank where one says it (Open MPI), else the process's only one
        launched = from_environment(environ)
        local = launched.local_rank if launched.rank == jax.process_index() else 0
        return Topology(jax.process_index(), jax.process_count(), local, "jax")
    return from_environment(environ)


_LAUNCHERS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "open-mpi"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "pmi"),
    ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "horovodrun"),
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "torch-style"),
    ("KERAS_DISTRIBUTION_PROCESS_ID", "KERAS_DISTRIBUTION_NUM_PROCESSES", "", "keras.distribution"),
)


def from_environment(environ: Mapping[str, str]) -> Topology:
    """The topology that the launcher's environment variables describe (size 1 when none is set)."""
    for rank_var, size_var, local_var, source in _LAUNCHERS:
        if rank_var in environ:
            rank = int(environ[rank_var])
            size = int(environ.get(size_var, rank + 1))
            return Topology(rank, size, int(environ.get(local_var, rank if local_var else 0)), source)
    cluster = tf_cluster(environ)
    if cluster is not None:
        return Topology(cluster.rank, cluster.size, 0, "tf-config")
    return Topology(0, 1, 0, "single-process")


# Launchers that start a fixed world of processes and say its size (horovodrun's own variables are left out: under
# elastic Horovod the world changes while they keep their first value).
_FIXED_WORLDS = (
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
    ("PMI_SIZE", "a PMI launcher (mpiexec, srun)"),
    ("KERAS_DISTRIBUTION_NUM_PROCESSES", "a launcher (KERAS_DISTRIBUTION_NUM_PROCESSES)"),
)


def launcher_world(environ: Mapping[str, str] = os.environ) -> tuple[int, str] | None:
    """The number of processes an MPI launcher started, and which launcher, if one started this process."""
    for variable, launcher in _FIXED_WORLDS:
        if environ.get(variable, "").isdigit():
            return int(environ[variable]), launcher
    return None


def check_horovod_world(
    horovod_size: int, environ: Mapping[str, str] = os.environ, *, mpi_built: bool = False, allowed: bool = False
) -> None:
    """Raise :class:`LauncherMismatchError` when an MPI launcher started several processes and Horovod sees a world
    of one in each: a Horovod built without MPI, or with an MPI other than the launcher's (an Open MPI build under
    MPICH's or Intel's ``mpiexec``). ``allowed``: a world of one was asked for (``hvd.init(comm=...)``; the option
    ``allow_world_of_one``).

    Every process of such a job sees the same numbers and the same build, so every process raises alike (rule 2)."""
    world = launcher_world(environ)
    if world is None or horovod_size != 1 or world[0] <= 1 or allowed:
        return
    size, launcher = world
    why = (
        "this Horovod was built with MPI, but not with the launcher's MPI (an Open MPI build under MPICH's or Intel's "
        "mpiexec initialises each process alone)"
        if mpi_built
        else "this Horovod was built without MPI"
    )
    fix = (
        "Launch with the MPI Horovod was built against (`horovodrun --check-build`; `mpirun --version`), or build "
        "Horovod against this launcher's MPI"
        if mpi_built
        else "Build Horovod with MPI (HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 pip install --no-cache-dir horovod; "
        "`horovodrun --check-build` lists MPI)"
    )
    raise LauncherMismatchError(
        f"hvd-mlflow: {launcher} started {size} processes, but Horovod sees a world of 1 in each: {why}, so every "
        f"process would train alone as rank 0 and log its own local values into the same run. {fix}, or launch with "
        "`horovodrun --gloo`. If each process is meant to train alone (hvd.init(comm=...)), pass "
        "allow_world_of_one=True (HVD_MLFLOW_ALLOW_WORLD_OF_ONE=1)."
    )


def check_tf_config_world(
    engine_size: int, strategy: str, environ: Mapping[str, str] = os.environ, *, allowed: bool = False
) -> None:
    """Raise :class:`LauncherMismatchError` when ``TF_CONFIG`` names several training tasks (chief and workers) but
    the model trains in a world of one: it was built outside a multi-worker ``strategy.scope()``, so every worker
    trains alone. Not for a ParameterServerStrategy cluster (there only the chief runs ``fit``). Every worker has
    the same ``TF_CONFIG`` cluster and the same code, so every worker raises alike (rule 2)."""
    cluster = tf_cluster(environ)
    if cluster is None or cluster.size <= 1 or cluster.parameter_servers or engine_size != 1 or allowed:
        return
    raise LauncherMismatchError(
        f"hvd-mlflow: TF_CONFIG names {cluster.size} workers, but this model's distribution strategy is {strategy}, "
        "which spans this process alone: the model was built outside `strategy.scope()`, so every worker would "
        "train alone on its own data and log its own values into the same run. Build and compile the model inside "
        "`with tf.distribute.MultiWorkerMirroredStrategy().scope():` (created once, before the model), or pass "
        "allow_world_of_one=True (HVD_MLFLOW_ALLOW_WORLD_OF_ONE=1) if each worker is meant to train alone."
    )


def check_launcher_world(
    engine_size: int, backend: str, environ: Mapping[str, str] = os.environ, *, allowed: bool = False
) -> None:
    """Raise :class:`LauncherMismatchError` when a launcher started several processes (Open MPI's ``mpirun``, a PMI
    launcher, ``KERAS_DISTRIBUTION_NUM_PROCESSES``) but no engine joins them (no Horovod initialised, no multi-worker
    strategy, no JAX runtime): every process would train alone and log its own values as rank 0. ``backend``: the
    model's (``"jax"``: keras.distribution is the engine to start). Every process of such a job sees the same
    variables and runs the same code, so every process raises alike (rule 2)."""
    world = launcher_world(environ)
    if world is None or world[0] <= 1 or engine_size != 1 or allowed:
        return
    size, launcher = world
    fix = (
        "Call keras.distribution.initialize() first (it reads Open MPI's variables, or KERAS_DISTRIBUTION_*), then "
        "keras.distribution.set_distribution(keras.distribution.DataParallel(devices=keras.distribution."
        "list_devices()))"
        if backend == "jax"
        else "Initialise the training's engine before fit (hvd.init() for Horovod)"
    )
    raise LauncherMismatchError(
        f"hvd-mlflow: {launcher} started {size} processes, but this one trains alone (no Horovod, multi-worker "
        f"strategy or keras.distribution joins them), so every process would log its own values into the same run "
        f"as rank 0. {fix}, or pass allow_world_of_one=True (HVD_MLFLOW_ALLOW_WORLD_OF_ONE=1) if each process is "
        "meant to train alone."
    )


def hostname() -> str:
    return socket.gethostname()


def describe_hosts(hosts: Sequence[str]) -> str:
    """Which ranks ran on which host, hosts in order of their first rank: ``node0:0-1 node1:2-3``."""
    ranks: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        ranks.setdefault(host, []).append(rank)
    return " ".join(f"{host}:{_ranges(numbers)}" for host, numbers in ranks.items())


def _ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5``."""
    runs = [[n for _, n in run] for _, run in itertools.groupby(enumerate(numbers), lambda pair: pair[1] - pair[0])]
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)
