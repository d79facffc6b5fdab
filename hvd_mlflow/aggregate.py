"""Turn each rank's epoch logs into global values with one collective.

Every rank takes the numeric entries of its logs in sorted key order and appends a signature of that key
list (a 20-bit hash ``h`` and ``h*h``). One float64 sum-allreduce of that vector gives the sums of every
value and lets every rank check, at no extra cost, that all ranks had the same keys: the sums equal
``size*h`` and ``size*h*h`` only if every rank's ``h`` is the same. When they differ (or Horovod refuses
vectors of different lengths), one ``allgather_object`` of the key lists builds an error that names the keys
each rank lacks, raised on every rank: never a silent mix of different metrics, never a hang.
"""

from __future__ import annotations

import numbers
import zlib
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

import numpy as np

from ._log import warn_once
from .collectives import Collectives

_SIGNATURE_BITS = 20


class MetricKeyMismatchError(RuntimeError):
    """Ranks reported different metric keys at the same epoch end, so their values cannot be combined."""


def scalar(value: Any) -> float | None:
    """``value`` as a float when it is one number (Python, NumPy or 0-d tensor), else ``None``."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        try:
            value = value.numpy()
        except Exception:  # noqa: BLE001 - not a tensor after all
            return None
    if isinstance(value, np.ndarray | np.generic) and np.size(value) == 1:
        try:
            return float(np.asarray(value, dtype=np.float64).reshape(()))
        except (TypeError, ValueError):
            return None
    return None


def numeric_entries(logs: Mapping[str, Any]) -> dict[str, float]:
    """The entries of ``logs`` that are single numbers, in sorted key order; others are warned about once."""
    out: dict[str, float] = {}
    for key in sorted(logs):
        value = scalar(logs[key])
        if value is None:
            warn_once(
                f"non-scalar:{key}",
                "hvd-mlflow: log entry %r is not a single number (%s); it is not averaged nor logged",
                key,
                type(logs[key]).__name__,
            )
            continue
        out[key] = value
    return out


def key_signature(keys: Iterable[str]) -> float:
    """A hash of the key list that survives a float64 sum exactly."""
    digest = zlib.crc32("\x00".join(keys).encode("utf-8"))
    return float(digest & ((1 << _SIGNATURE_BITS) - 1))


def mismatch_message(key_lists: list[list[str]]) -> str:
    """Name, per rank, the keys that some other rank has and this one lacks."""
    union = sorted(set().union(*map(set, key_lists)))
    lines = [
        "hvd-mlflow: ranks reported different metric keys at epoch end, so they cannot be averaged "
        "(every rank must compile the same metrics and pass the same validation data)."
    ]
    for rank, keys in enumerate(key_lists):
        lacking = [k for k in union if k not in keys]
        if lacking:
            lines.append(f"  rank {rank} lacks: {', '.join(lacking)}")
    return "\n".join(lines)


class MeanReducer:
    """Horovod ``MetricAverageCallback`` semantics: the unweighted mean over ranks, in float64."""

    name = "mean"

    def __init__(self, collectives: Collectives) -> None:
        self._comm = collectives

    def reduce(self, values: Mapping[str, float], tag: str) -> dict[str, float]:
        """Global means of ``values``; ``tag`` names the collective (the same on every rank)."""
        keys = list(values)
        if self._comm.size == 1:
            return dict(values)
        signature = key_signature(keys)
        vector = np.array([*values.values(), signature, signature * signature], dtype=np.float64)
        try:
            total = self._comm.allreduce_sum(vector, name=f"hvd_mlflow.{tag}")
        except Exception:  # noqa: BLE001 - Horovod refuses vectors of different lengths
            self._raise_if_keys_differ(keys, tag)
            raise
        size = self._comm.size
        if total[-2] != size * signature or total[-1] != size * signature * signature:
            self._raise_if_keys_differ(keys, tag)
        return {key: float(total[i]) / size for i, key in enumerate(keys)}

    def _raise_if_keys_differ(self, keys: list[str], tag: str) -> None:
        key_lists = self._comm.allgather_object(keys, name=f"hvd_mlflow.{tag}.keys")
        if any(other != keys for other in key_lists):
            raise MetricKeyMismatchError(mismatch_message(key_lists))


def write_back(logs: MutableMapping[str, Any], global_values: Mapping[str, float]) -> None:
    """Replace each reduced entry of ``logs`` in place, so later callbacks see the global value."""
    for key, value in global_values.items():
        logs[key] = value
