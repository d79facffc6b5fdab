"""The params and tags that describe a distributed training, computed on rank 0 at its start."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .._version import __version__
from ..common import topology
from ..common.dependencies import installed_version
from . import keras_flavour
from .aggregate import scalar
from .collectives import Collectives


def versions(flavour: str) -> dict[str, str]:
    tf = sys.modules.get("tensorflow")
    found = {
        "tensorflow_version": getattr(tf, "__version__", None)
        or installed_version("tensorflow-cpu")
        or installed_version("tensorflow"),
        "keras_version": keras_flavour.version(flavour),
        "horovod_version": installed_version("horovod"),
        "mlflow_version": installed_version("mlflow-skinny") or installed_version("mlflow"),
        "hvd_mlflow_version": __version__,
    }
    return {k: v for k, v in found.items() if v}


def current_learning_rate(model: Any) -> float | None:
    """The optimizer's learning rate now (schedules evaluated at the current iteration), if it has one."""
    optimizer = getattr(model, "optimizer", None)
    rate = getattr(optimizer, "learning_rate", None)
    if callable(rate) and not hasattr(rate, "numpy"):  # a tf_keras schedule object
        rate = rate(optimizer.iterations)
    return scalar(rate) if rate is not None else None


def optimizer_iterations(model: Any) -> int | None:
    """The optimizer's step count (the global step: the same on every rank), if the model has one."""
    iterations = getattr(getattr(model, "optimizer", None), "iterations", None)
    value = scalar(iterations) if iterations is not None else None
    return int(value) if value is not None else None


def optimizer_params(model: Any) -> dict[str, str]:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return {}
    out = {"optimizer_name": type(optimizer).__name__}
    rate = getattr(optimizer, "learning_rate", None)
    if rate is not None:
        value = scalar(rate)
        out["learning_rate"] = f"{value:.6g}" if value is not None else type(rate).__name__
    return out


def training_params(
    keras_params: Mapping[str, Any], model: Any, comm: Collectives, batch_size: int | None, epoch: int, flavour: str
) -> dict[str, str]:
    """Params of a run: the training's shape over all ranks (``comm``'s; ``epoch``: the fit's first), the optimizer
    and the software versions.
    ``batch_size``: fit's, each rank's (Horovod), or the global batch the engine splits over ranks (tf.distribute:
    ``comm.batch_is_global``)."""
    world_size = comm.size
    if batch_size and comm.batch_is_global:
        global_batch, batch_size = batch_size, batch_size // world_size if batch_size % world_size == 0 else None
    else:
        global_batch = batch_size * world_size if batch_size else None
    params: dict[str, Any] = {
        "epochs": keras_params.get("epochs"),
        "steps_per_epoch": keras_params.get("steps"),
        "initial_epoch": epoch,
        "world_size": world_size,
        "batch_size": batch_size,
        "global_batch_size": global_batch,
    }
    params.update(optimizer_params(model))
    params.update(versions(flavour))
    return {k: str(v) for k, v in params.items() if v is not None}


GLOBAL_BATCH = "global batch"  # the reduction tag under keras.distribution: Keras' values, computed on the global batch


def run_tags(comm: Collectives, options: Any, flavour: str) -> dict[str, str]:
    """The run's tags: ``comm``'s engine and size, ``options``' reduction and extra tags. An engine whose Keras values
    are global already (``comm.values_are_global``) reduces nothing."""
    tags = {
        "hvd_mlflow.engine": comm.engine,
        "hvd_mlflow.world_size": str(comm.size),
        "hvd_mlflow.reduction": GLOBAL_BATCH if comm.values_are_global and comm.size > 1 else options.reduction,
        "hvd_mlflow.keras_flavour": flavour,
    }
    tags.update({str(k): str(v) for k, v in options.extra_tags.items()})
    return tags


def hosts_tag(hosts: Sequence[str]) -> dict[str, str]:
    """Which ranks ran where (every rank's host, from the train-begin collective): the rank of a ``system/*_max``
    names its node."""
    return {"hvd_mlflow.hosts": topology.describe_hosts(hosts)} if hosts else {}
