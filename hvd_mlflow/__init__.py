"""hvd-mlflow: clean, global per-epoch training curves in MLflow and AzureML Studio for Keras on Horovod.

Example::

    import horovod.tensorflow as hvd
    import hvd_mlflow

    hvd.init()
    hvd_mlflow.autolog()          # on every rank
    model.fit(...)                # one point per metric per epoch, global over all ranks, logged by rank 0

TensorFlow, Keras, Horovod and MLflow are imported only when they are used, so importing this package is
cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    EmptyShardError,
    HvdMlflowError,
    LauncherMismatchError,
    MetricKeyMismatchError,
    MetricNameCollisionError,
    MissingDependencyError,
    OptionsMismatchError,
    ShardMismatchError,
)

if TYPE_CHECKING:
    from .autologging import autolog
    from .callback import HorovodMlflowCallback

__all__ = [
    "autolog",
    "HorovodMlflowCallback",
    "EmptyShardError",
    "HvdMlflowError",
    "LauncherMismatchError",
    "MetricKeyMismatchError",
    "MetricNameCollisionError",
    "MissingDependencyError",
    "OptionsMismatchError",
    "ShardMismatchError",
    "__version__",
]

_LAZY = {
    "autolog": ("autologging", "autolog"),
    "HorovodMlflowCallback": ("callback", "HorovodMlflowCallback"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
