"""Where this process stands in the job: rank, world size and local rank.

Horovod is asked when it is initialised; otherwise the launcher's environment is read (Open MPI as AzureML's
MPI jobs use it, PMI, torchrun-style ``RANK``/``WORLD_SIZE``, ``TF_CONFIG``), so the answer is right even
before ``hvd.init()``. Horovod is never imported here: only consulted when the user imported it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Mapping


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
