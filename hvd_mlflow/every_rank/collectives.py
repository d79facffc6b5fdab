"""The few collectives hvd-mlflow needs, on Horovod's ``horovod.tensorflow`` primitives.

Horovod's Keras layer is broken on Keras 3, so only ``allreduce``, ``allgather``, ``allgather_object`` and
``broadcast_object`` are used. With one process, or Horovod not initialised, :class:`Solo` stands in and
nothing is communicated.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..common import topology


class Collectives(Protocol):
    rank: int
    size: int

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray: ...
    def allgather(self, values: np.ndarray, name: str) -> np.ndarray: ...
    def allgather_object(self, obj: Any, name: str) -> list[Any]: ...
    def broadcast_object(self, obj: Any, name: str) -> Any: ...


class Solo:
    """One process: every collective is the identity."""

    rank = 0
    size = 1

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        return values

    def allgather(self, values: np.ndarray, name: str) -> np.ndarray:
        return values

    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        return [obj]

    def broadcast_object(self, obj: Any, name: str) -> Any:
        return obj


class Horovod:
    """The collectives of an initialised ``horovod.tensorflow``."""

    def __init__(self, hvd: Any) -> None:
        self._hvd = hvd
        self.rank = hvd.rank()
        self.size = hvd.size()

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        out = self._hvd.allreduce(np.ascontiguousarray(values), op=self._hvd.Sum, name=name)
        return np.asarray(out.numpy() if hasattr(out, "numpy") else out, dtype=values.dtype)

    def allgather(self, values: np.ndarray, name: str) -> np.ndarray:
        """Every rank's 1-D ``values``, concatenated in rank order (lengths may differ)."""
        out = self._hvd.allgather(np.ascontiguousarray(values), name=name)
        return np.asarray(out.numpy() if hasattr(out, "numpy") else out, dtype=values.dtype)

    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        return list(self._hvd.allgather_object(obj, name=name))

    def broadcast_object(self, obj: Any, name: str) -> Any:
        return self._hvd.broadcast_object(obj, root_rank=0, name=name)


def current() -> Collectives:
    """Horovod's collectives when it is initialised with more than one process, else :class:`Solo`."""
    hvd = topology.horovod_if_initialised()
    if hvd is not None and hvd.size() > 1:
        return Horovod(hvd)
    return Solo()
