"""Per-rank health next to the curves (``system_metrics``): every rank samples its own process in a thread; the
epoch's means ride in the epoch collective; rank 0 logs the minimum, mean and maximum over ranks and the rank of
the maximum, as ``system/<name>_min|_mean|_max|_max_rank``. A job runs at the speed of its slowest rank: this
names it, within the metric-name budget (these names come last), with no request from any other rank.

Sampled with psutil (what MLflow's own system-metrics module uses): the process's CPU percent (of one core) and
resident memory; with NVML (pynvml) the GPU this rank trains on too: the local rank's entry of
``CUDA_VISIBLE_DEVICES`` (an index or a ``GPU-`` UUID, as CUDA reads it; NVML itself ignores the variable), else the
GPU numbered by the local rank. A value that cannot be read is NaN (every rank sends as many values whatever it can
read, so the collective's layout stays the same). Without psutil, or without NVML where GPUs are visible, one warning
says what is missing and how to install it.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from typing import Any

from .._log import warn_once

NAMES = ("cpu_percent", "rss_mb", "gpu_percent", "gpu_memory_mb")
INTERVAL_S = 0.5


class SystemSampler:
    """Samples this process every :data:`INTERVAL_S` in a daemon thread; :meth:`epoch_means` reads and resets."""

    def __init__(self, local_rank: int = 0) -> None:
        self._local_rank = local_rank
        self._sums = dict.fromkeys(NAMES, 0.0)
        self._counts = dict.fromkeys(NAMES, 0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hvd-mlflow-system", daemon=True)
        self._process: Any = None
        self._gpu: Any = None

    def start(self) -> None:
        try:
            import psutil

            self._process = psutil.Process()
            self._process.cpu_percent(None)  # the first call only starts the count
        except Exception:  # noqa: BLE001 - no psutil: CPU and memory stay NaN
            self._process = None
            warn_once("system-psutil", "hvd-mlflow: system_metrics is on, but psutil cannot be imported here: no CPU "
                      "or memory metrics from this process (pip install psutil)")  # fmt: skip
        self._gpu = _nvml_handle(gpu_of(self._local_rank, os.environ))
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def epoch_means(self) -> dict[str, float]:
        with self._lock:
            means = {n: self._sums[n] / self._counts[n] if self._counts[n] else math.nan for n in NAMES}
            self._sums, self._counts = dict.fromkeys(NAMES, 0.0), dict.fromkeys(NAMES, 0)
        return means

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            sample = self._sample()
            with self._lock:
                for name, value in sample.items():
                    if not math.isnan(value):
                        self._sums[name] += value
                        self._counts[name] += 1

    def _sample(self) -> dict[str, float]:
        out = dict.fromkeys(NAMES, math.nan)
        try:
            if self._process is not None:
                out["cpu_percent"] = float(self._process.cpu_percent(None))
                out["rss_mb"] = self._process.memory_info().rss / 2**20
            if self._gpu is not None:
                import pynvml

                out["gpu_percent"] = float(pynvml.nvmlDeviceGetUtilizationRates(self._gpu).gpu)
                out["gpu_memory_mb"] = pynvml.nvmlDeviceGetMemoryInfo(self._gpu).used / 2**20
        except Exception:  # noqa: BLE001 - a sample that fails is a gap, never an error in the training
            pass
        return out


def gpu_of(local_rank: int, environ: Mapping[str, str]) -> str | int | None:
    """The GPU this rank trains on, as NVML names it: the local rank's entry of ``CUDA_VISIBLE_DEVICES`` (an index,
    or a UUID), the local rank itself when the variable is not set, ``None`` when it hides every GPU."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return local_rank
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not entries or entries[0] == "-1":
        return None
    entry = entries[local_rank % len(entries)]  # one process per GPU, or every process sees its own GPU alone
    return int(entry) if entry.isdigit() else entry


def _nvml_handle(gpu: str | int | None) -> Any:
    if gpu is None:
        return None
    try:
        import pynvml
    except Exception:  # noqa: BLE001 - no NVML: the GPU values stay NaN; said once where GPUs are to be seen
        if os.path.exists("/dev/nvidia0"):
            warn_once("system-nvml", "hvd-mlflow: system_metrics is on and this machine has GPUs, but pynvml cannot "
                      "be imported: no GPU metrics (pip install nvidia-ml-py)")  # fmt: skip
        return None
    try:
        pynvml.nvmlInit()
        if isinstance(gpu, str):
            return pynvml.nvmlDeviceGetHandleByUUID(gpu)
        return pynvml.nvmlDeviceGetHandleByIndex(gpu)
    except Exception:  # noqa: BLE001 - no driver, no such GPU: the GPU values stay NaN
        return None


def summary(per_rank: dict[str, list[float]]) -> dict[str, float]:
    """``system/<name>_min|_mean|_max|_max_rank`` over ranks, for the names some rank could read."""
    out: dict[str, float] = {}
    for name, values in per_rank.items():
        known = [(v, r) for r, v in enumerate(values) if not math.isnan(v)]
        if not known:
            continue
        peak, peak_rank = max(known)
        out.update({f"system/{name}_min": min(v for v, _ in known), f"system/{name}_max": peak,
                    f"system/{name}_mean": sum(v for v, _ in known) / len(known),
                    f"system/{name}_max_rank": float(peak_rank)})  # fmt: skip
    return out
