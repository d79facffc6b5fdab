"""Which Keras a model belongs to, and that Keras' ``Callback`` and ``Model`` classes.

Three flavours exist in the supported environments:

* ``keras``: the ``keras`` package, Keras 3 with TensorFlow >= 2.16, or Keras 2 bundled with TF 2.15
  (then ``tf.keras`` is the same package);
* ``tf_keras``: the legacy Keras 2 package that ``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras`` with TF >= 2.16.

A callback of one flavour crashes or misbehaves in the other's ``fit``, so the base class of hvd-mlflow's
callback is always chosen from the model being fitted.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

FLAVOURS = ("keras", "tf_keras")


def _module(flavour: str) -> ModuleType:
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown Keras flavour {flavour!r}; expected one of {FLAVOURS}")
    return importlib.import_module(flavour)


def of_model(model: object) -> str:
    """The flavour whose ``Model`` class ``model`` is an instance of (user subclasses included)."""
    for klass in type(model).__mro__:
        root = klass.__module__.split(".", 1)[0]
        if root in FLAVOURS and klass.__name__ in ("Model", "Functional", "Sequential"):
            return root
    raise TypeError(
        f"{type(model).__name__} is not a Keras model (neither keras.Model nor tf_keras.Model); "
        "hvd-mlflow logs Keras fit() only"
    )


def backend(model: object) -> str:
    """The backend ``model`` computes on: ``"tensorflow"`` for tf_keras and Keras 2, else Keras 3's own
    (``keras.backend.backend()``: ``"jax"``, ``"torch"``, ``"tensorflow"``...), the same for every model of a
    process."""
    if of_model(model) != "keras" or not version("keras").startswith("3"):
        return "tensorflow"
    return str(_module("keras").backend.backend())


def runs_on_tensorflow(model: object) -> bool:
    """Whether ``model``'s variables are TensorFlow's: where the exact reduction reads metric states, and where
    tf.distribute and Horovod's TensorFlow collectives apply."""
    return backend(model) == "tensorflow"


def read_scalar(variable: Any) -> float:
    """A Keras 3 variable's value as a float, on any backend: under keras.distribution on JAX the value is one array
    spread over the processes, read from this process's own copy."""
    value = getattr(variable, "value", variable)
    shard = getattr(value, "addressable_data", None)
    if callable(shard):
        value = shard(0)
    return float(_module("keras").ops.convert_to_numpy(value))


def legacy_setting() -> str:
    """``TF_USE_LEGACY_KERAS`` as set (empty when unset): TensorFlow 2.16+ makes ``tf.keras`` tf_keras when true."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "")


def check_model(model: Any, flavour: str | None) -> None:
    """Raise ``TypeError`` when ``model`` is not of ``flavour`` (a callback is built for one flavour)."""
    actual = of_model(model)
    if actual != flavour:
        raise TypeError(
            f"this HorovodMlflowCallback was built for {flavour} but the model is a {actual} "
            f"model; create it with HorovodMlflowCallback(model=model)"
        )


def of_tf_keras() -> str:
    """The flavour that ``tf.keras`` resolves to here, without importing TensorFlow."""
    legacy = legacy_setting().strip().lower() in ("1", "true")
    if legacy and importlib.util.find_spec("tf_keras") is not None:
        return "tf_keras"
    return "keras"


def callback_base(flavour: str) -> type:
    return _module(flavour).callbacks.Callback


def model_class(flavour: str) -> type:
    return _module(flavour).Model


def version(flavour: str) -> str:
    return str(getattr(_module(flavour), "__version__", "unknown"))


def when_imported(hook: Callable[[str], None]) -> None:
    """Call ``hook(flavour)`` for each installed flavour as soon as it is imported (at once for those already
    imported), without importing any: tf_keras alone takes a third of a second, and a Keras 3 job never uses it.
    ``wrapt``'s post-import hooks (a TensorFlow dependency)."""
    import wrapt

    for flavour in FLAVOURS:
        if importlib.util.find_spec(flavour) is not None:
            wrapt.register_post_import_hook(lambda _module, flavour=flavour: hook(flavour), flavour)


def steps_per_execution(model: object) -> int:
    """How many batches Keras runs between two calls of the batch hooks (``compile(steps_per_execution=...)``)."""
    value = getattr(model, "steps_per_execution", None)  # Keras 3: an int
    if value is None:
        value = getattr(model, "_steps_per_execution", None)  # tf_keras / Keras 2: a variable
    try:
        return max(1, int(value.numpy() if hasattr(value, "numpy") else value))
    except (TypeError, ValueError):
        return 1


def steps_per_execution_is_tuned(model: object) -> bool:
    """``compile(steps_per_execution="auto")`` (tf_keras / Keras 2): each rank tunes it on its own clock."""
    return bool(getattr(model, "_autotune_steps_per_execution", False))


def csv_logger(flavour: str, path: str, append: bool) -> object:
    """Keras' own ``CSVLogger`` of ``flavour``."""
    return _module(flavour).callbacks.CSVLogger(path, append=append)
