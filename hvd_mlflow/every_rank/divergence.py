"""Do the ranks still train the same model? A fingerprint of the weights, compared in the epoch's collective.

A global metric means something only when every rank holds the same weights. They drift apart more often than one
thinks: Horovod's ``DistributedOptimizer`` does not average gradients on Keras 3, the initial broadcast was
forgotten, a rank restored another checkpoint, initialisation is per rank. The curve then averages different
models and looks fine.

Each rank computes two numbers from its trainable weights (eagerly, then in one compiled call with one transfer once
every rank has traced it: :mod:`hvd_mlflow.every_rank.tracing`):
the sum of their absolute values and the sum of their squares (both far from 0, so a relative spread means
something; a plain sum of weights centred on 0 is not). They ride in the epoch collective the callback already
makes (each rank adds the numbers and their squares), so every rank learns the spread of the fingerprints over
ranks at no extra collective, and decides alike: when the relative spread passes :data:`TOLERANCE`, every rank
warns once, rank 0 tags the run ``hvd_mlflow.diverged_at_epoch`` and logs ``weights_rank_spread`` from then on.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from .tracing import Traced

TOLERANCE = 1e-5  # relative spread of the fingerprints; identical weights give 0 (float32 sums: ~1e-7 at most)
CARRIED = ("fp_abs", "fp_abs_sq", "fp_sq", "fp_sq_sq")  # what each rank adds to the epoch collective
TAG = "hvd_mlflow.diverged_at_epoch"
METRIC = "weights_rank_spread"

_FUNCTIONS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def fingerprint(model: Any, compiled: bool = False) -> tuple[float, float]:
    """The sum of absolute values and the sum of squares of the trainable weights: eagerly, or, once every rank has
    traced it (``compiled``, agreed: :mod:`hvd_mlflow.every_rank.tracing`), one call of a concrete function, one
    transfer."""
    function = _function(model)
    if function is None:
        return 0.0, 0.0
    if compiled and function.traced.ready:
        total, squares = np.asarray(function.traced.concrete(), dtype=np.float64)
    else:
        total, squares = np.asarray(function.compute(), dtype=np.float64)
    return float(total), float(squares)


def trace_in_background(model: Any) -> Traced | None:
    """Start tracing the fingerprint's compiled form off the training thread; ``None`` for a model without weights."""
    function = _function(model)
    if function is None:
        return None
    function.traced.start()
    return function.traced


def _function(model: Any) -> _Fingerprint | None:
    variables = list(getattr(model, "trainable_variables", []) or [])
    if not variables:
        return None
    function = _FUNCTIONS.get(model)
    if function is None or function.ids != [id(v) for v in variables]:
        function = _Fingerprint(variables)
        _FUNCTIONS[model] = function
    return function


class _Fingerprint:
    """One model's fingerprint: its variables' ids (holding the variables keeps the ids theirs), the eager
    computation, and its compiled form, traced in the background."""

    def __init__(self, variables: list[Any]) -> None:
        self.variables = variables
        self.ids = [id(v) for v in variables]
        self.traced = Traced(self._trace)

    def compute(self) -> Any:
        import tensorflow as tf

        sums = [tf.reduce_sum(tf.abs(tf.cast(v, tf.float32))) for v in self.variables]
        squares = [tf.reduce_sum(tf.square(tf.cast(v, tf.float32))) for v in self.variables]
        return tf.stack([tf.add_n(sums), tf.add_n(squares)])

    def _trace(self) -> Any:
        import tensorflow as tf

        return tf.function(self.compute, autograph=False).get_concrete_function()


def carry(model: Any, compiled: bool = False) -> dict[str, float]:
    """This rank's share of the epoch collective: each fingerprint number, and its square."""
    total, squares = fingerprint(model, compiled)
    return {"fp_abs": total, "fp_abs_sq": total * total, "fp_sq": squares, "fp_sq_sq": squares * squares}


def spread(carried: Mapping[str, float], ranks: int) -> float:
    """The relative spread over ranks of the fingerprints (0 when every rank holds the same weights)."""
    worst = 0.0
    for name in ("fp_abs", "fp_sq"):
        mean = carried[name] / ranks
        variance = max(0.0, carried[f"{name}_sq"] / ranks - mean * mean)
        worst = max(worst, math.sqrt(variance) / max(abs(mean), 1e-12))
    return worst


def warning(epoch: int, value: float) -> str:
    return (
        f"hvd-mlflow: the ranks hold different weights at epoch {epoch} (relative spread of their weight "
        f"fingerprints {value:.3g}): the global metrics average different models. Likely causes: gradients not "
        "averaged (Horovod's DistributedOptimizer does not average them on Keras 3), no broadcast of the initial "
        "weights (BroadcastGlobalVariablesCallback, or hvd.broadcast_object of model.get_weights()), a checkpoint "
        "restored on some ranks only, or a per-rank random seed."
    )
