"""system_metrics: which GPU a rank reads, and one warning when what it reads with is missing."""

from __future__ import annotations

import logging
import math
import sys
import time

import pytest

from hvd_mlflow import _log
from hvd_mlflow.every_rank import system_metrics
from hvd_mlflow.every_rank.system_metrics import gpu_of


def test_the_gpu_is_the_local_rank_s_entry_of_cuda_visible_devices():
    assert gpu_of(1, {}) == 1  # no variable: the local rank's own GPU
    assert gpu_of(1, {"CUDA_VISIBLE_DEVICES": "4,6"}) == 6  # what CUDA calls device 1 is NVML's 6
    assert gpu_of(0, {"CUDA_VISIBLE_DEVICES": "3"}) == 3  # a worker that sees its own GPU alone (tf.distribute)
    assert gpu_of(1, {"CUDA_VISIBLE_DEVICES": "3"}) == 3
    assert gpu_of(0, {"CUDA_VISIBLE_DEVICES": "GPU-8d1c2a7e-aaaa"}) == "GPU-8d1c2a7e-aaaa"
    assert gpu_of(0, {"CUDA_VISIBLE_DEVICES": ""}) is None and gpu_of(0, {"CUDA_VISIBLE_DEVICES": "-1"}) is None


def test_without_psutil_one_warning_says_so_and_the_values_are_gaps(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError
    monkeypatch.setattr(_log, "_said", set())
    sampler = system_metrics.SystemSampler()
    with caplog.at_level(logging.WARNING, logger="hvd_mlflow"):
        sampler.start()
        time.sleep(system_metrics.INTERVAL_S * 1.5)
        sampler.stop()
        system_metrics.SystemSampler().start()  # a second fit: said once per process
    said = [r.getMessage() for r in caplog.records if "psutil" in r.getMessage()]
    assert said == ["hvd-mlflow: system_metrics is on, but psutil cannot be imported here: no CPU or memory metrics "
                    "from this process (pip install psutil)"]  # fmt: skip
    assert math.isnan(sampler.epoch_means()["rss_mb"])


@pytest.mark.skipif(sys.modules.get("psutil") is None and __import__("importlib").util.find_spec("psutil") is None,
                    reason="psutil not installed")  # fmt: skip
def test_with_psutil_nothing_is_said(monkeypatch, caplog):
    monkeypatch.setattr(_log, "_said", set())
    sampler = system_metrics.SystemSampler()
    with caplog.at_level(logging.WARNING, logger="hvd_mlflow"):
        sampler.start()
        time.sleep(system_metrics.INTERVAL_S * 1.5)
        sampler.stop()
    assert not [r for r in caplog.records if "psutil" in r.getMessage()]
    assert sampler.epoch_means()["rss_mb"] > 10


@pytest.mark.parametrize("gpus", [True, False])
def test_without_pynvml_a_machine_with_gpus_says_so_once(monkeypatch, caplog, gpus):
    """reference.md's `system_metrics` row: without pynvml on a machine with GPUs, one warning says what is missing;
    without GPUs nothing is missing and nothing is said. A GPU is present as the code sees it: /dev/nvidia0."""
    import os.path

    real_exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda path: (gpus and path == "/dev/nvidia0") or real_exists(path))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the local rank's GPU, number 0
    monkeypatch.setattr(_log, "_said", set())
    samplers = [system_metrics.SystemSampler(), system_metrics.SystemSampler()]  # two fits in one process
    with caplog.at_level(logging.WARNING, logger="hvd_mlflow"):
        for sampler in samplers:
            sampler.start()
            sampler.stop()
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "pynvml" in r.getMessage()]
    assert said == (["hvd-mlflow: system_metrics is on and this machine has GPUs, but pynvml cannot be imported: no "
                     "GPU metrics (pip install nvidia-ml-py)"] if gpus else [])  # fmt: skip
