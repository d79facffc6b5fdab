"""The batch size of a ``fit`` call, for the run's ``batch_size`` and ``global_batch_size`` params.

``fit``'s ``batch_size`` when given; Keras' default of 32 for array inputs; for a ``tf.data`` pipeline, the size its
``batch`` step batches by, read off the pipeline (the ``batch`` with a constant size, behind steps that keep the
size of an element: ``map``, ``prefetch``, ``shuffle``, ``repeat``, ``cache``, ``take``, ``filter``, ...). Anything else
(a generator, a ``PyDataset``, ``unbatch``/``rebatch``/``interleave``/``window`` after the batch, a size computed at
run time, a dataset the strategy distributed) is unknown: the params then leave the batch size out rather than
guess. Only params depend on it: nothing here decides a collective.

Example::

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000).batch(64).prefetch(2)
    of_fit({"x": dataset})  # 64
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KERAS_DEFAULT = 32  # fit's batch size for arrays when none is given
# tf.data steps that neither merge nor split elements: the batch behind them is the batch fit sees
_KEEPS_ELEMENTS = ("Map", "Prefetch", "Shuffle", "Repeat", "Cache", "Take", "Skip", "Options", "Filter", "Shard",
                   "AssertCardinality", "IgnoreErrors")  # fmt: skip
_CHANGES_ELEMENTS = ("FlatMap", "Interleave", "Unbatch", "Rebatch", "Window", "Group", "Bucket", "Scan")
_MOST_STEPS = 64  # how far up the pipeline to look


def of_fit(arguments: Mapping[str, Any]) -> int | None:
    """The batch size ``fit`` will use per call of its step (each rank's under Horovod; the global one under
    tf.distribute, which splits it): given, Keras' default for arrays, a ``tf.data`` pipeline's, or None. Never
    raises (it describes the run; a rank raising alone would stop that rank alone)."""
    try:
        if arguments.get("batch_size") is not None:
            return int(arguments["batch_size"])
        x = arguments.get("x")
        if x is None:
            return None
        if hasattr(x, "element_spec"):
            return of_dataset(x)
        return KERAS_DEFAULT if hasattr(x, "shape") else None
    except Exception:  # noqa: BLE001 - unknown, never an error
        return None


def of_dataset(dataset: Any) -> int | None:
    """The constant size a ``tf.data`` pipeline batches its elements by, or None when it cannot be known."""
    node = dataset
    for _ in range(_MOST_STEPS):
        kind = type(node).__name__
        size = getattr(node, "_batch_size", None)
        if size is None:  # map_and_batch keeps it under another name
            size = getattr(node, "_batch_size_t", None)
        if size is not None and "Batch" in kind:
            return _constant(size)
        if any(part in kind for part in _CHANGES_ELEMENTS) or not any(part in kind for part in _KEEPS_ELEMENTS):
            return None
        node = getattr(node, "_input_dataset", None)
        if node is None:
            return None
    return None


def _constant(size: Any) -> int | None:
    try:
        import tensorflow as tf

        value = tf.get_static_value(size)
        return int(value) if value is not None and int(value) > 0 else None
    except Exception:  # noqa: BLE001 - a pipeline of tf.data's own internals: unknown, never an error
        return None
