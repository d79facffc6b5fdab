"""Where this process stands in the job: rank, world size and local rank.

Horovod is asked when it is initialised; otherwise the launcher's environment is read (Open MPI as AzureML's
MPI jobs use it, PMI, torchrun-style ``RANK``/``WORLD_SIZE``, ``TF_CONFIG``), so the answer is right even
before ``hvd.init()``. Horovod is never imported here: only consulted when the user imported it.
"""

from __future__ import annotations

import dataclasses
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

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


def horovod_if_initialised():
    """The ``horovod.tensorflow`` module if the user imported and initialised it, else ``None``."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None:
        return None
    try:
        return hvd if hvd.is_initialized() else None
    except (AttributeError, ValueError):
        return None


def current(environ: Mapping[str, str] | None = None) -> Topology:
    """The topology of this process."""
    hvd = horovod_if_initialised()
    if hvd is not None:
        return Topology(hvd.rank(), hvd.size(), hvd.local_rank(), "horovod")
    return from_environment(os.environ if environ is None else environ)


_LAUNCHERS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "open-mpi"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "pmi"),
    ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "horovodrun"),
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "torch-style"),
)


def from_environment(environ: Mapping[str, str]) -> Topology:
    """The topology that the launcher's environment variables describe (size 1 when none is set)."""
    for rank_var, size_var, local_var, source in _LAUNCHERS:
        if rank_var in environ:
            rank = int(environ[rank_var])
            size = int(environ.get(size_var, rank + 1))
            return Topology(rank, size, int(environ.get(local_var, rank)), source)
    if "TF_CONFIG" in environ:
        try:
            config = json.loads(environ["TF_CONFIG"])
            task = config.get("task", {})
            cluster = config.get("cluster", {})
            chiefs = len(cluster.get("chief", []))
            workers = len(cluster.get("worker", []))
            index = int(task.get("index", 0))
            rank = index if task.get("type") == "chief" else index + chiefs
            return Topology(rank, max(chiefs + workers, 1), 0, "tf-config")
        except (ValueError, TypeError, AttributeError):
            pass
    return Topology(0, 1, 0, "single-process")


# Launchers that start a fixed world of processes and say its size (horovodrun's own variables are left out: under
# elastic Horovod the world changes while they keep their first value).
_FIXED_WORLDS = (("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"), ("PMI_SIZE", "a PMI launcher (mpiexec, srun)"))


def launcher_world(environ: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """The number of processes an MPI launcher started, and which launcher, if one started this process."""
    environ = os.environ if environ is None else environ
    for variable, launcher in _FIXED_WORLDS:
        if environ.get(variable, "").isdigit():
            return int(environ[variable]), launcher
    return None


def check_horovod_world(
    horovod_size: int, environ: Mapping[str, str] | None = None, *, mpi_built: bool = False
) -> None:
    """Raise :class:`LauncherMismatchError` when an MPI launcher started several processes and a Horovod built
    without MPI sees one (an MPI-built Horovod in a world of one was asked for it: ``hvd.init(comm=...)``).

    Every process of such a job sees the same numbers and the same build, so every process raises alike (rule 2)."""
    world = launcher_world(environ)
    if world is None or horovod_size != 1 or world[0] <= 1 or mpi_built:
        return
    size, launcher = world
    raise LauncherMismatchError(
        f"hvd-mlflow: {launcher} started {size} processes, but Horovod sees a world of 1 in each: this Horovod was "
        "built without MPI, so every process would train alone as rank 0 and log its own local values into the same "
        "run. Build Horovod with MPI (HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 pip install --no-cache-dir "
        "horovod; `horovodrun --check-build` lists MPI), or launch with `horovodrun --gloo`."
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
    parts: list[str] = []
    start = previous = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == previous + 1:
            previous = n
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if n is not None:
            start = previous = n
    return ",".join(parts)
