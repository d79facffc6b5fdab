"""tf.distribute's metric variables, read and used on this worker alone: never one of the strategy's collectives.

Under a tf.distribute strategy Keras keeps each metric's state in SyncOnRead variables (aggregation SUM): one local
copy per replica. Reading one in cross-replica context, where ``fit``'s callbacks run (tf_keras runs them inside
``strategy.scope()``), sums the copies over every replica of every worker: a collective, which every worker must call
at the same point, and a sum hvd-mlflow would count again. tf_keras' ``metric.result()`` reaches the same collective
through a ``merge_call``, and an assign there writes ``value / replicas`` into each copy (and reads it back, the
collective again). hvd-mlflow needs each worker's own state (it sums the states over workers itself, once, in its
epoch collective) and the results of a given state on this worker alone, so here:

* :func:`components`: a variable's local copies (``.values``), read directly: no collective;
* :func:`in_replicas`: a function run in replica context (``strategy.run``), where an assign writes this replica's
  copy and a read reads it; the first local replica's result;
* :func:`result`: a metric's own ``result`` (the class's: not tf_keras' ``merge_call`` wrapper on the instance);
* :func:`adds_over_workers`: whether a metric's variables aggregate by SUM, i.e. whether its state adds up over
  workers as the state of one process does (a MEAN- or first-replica-aggregated variable does not).

Outside tf.distribute (Horovod, one process) every function leaves the variables as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def tf_variable(variable: Any) -> Any:
    """The TensorFlow variable behind a metric variable (Keras 3 wraps one; tf_keras' are TensorFlow's)."""
    inner = getattr(variable, "value", None)
    return inner if type(variable).__module__.startswith("keras") and hasattr(inner, "assign") else variable


def is_distributed(variable: Any) -> bool:
    """Whether ``variable`` is a tf.distribute variable (one copy per replica)."""
    import tensorflow as tf

    return isinstance(tf_variable(variable), tf.distribute.DistributedValues)


def components(variable: Any) -> list[Any]:
    """This process's own copies of a tf.distribute variable (one per local replica: reading them is no collective),
    or the variable itself."""
    inner = tf_variable(variable)
    if is_distributed(inner):
        return list(inner.values)
    return [inner]


def strategy_of(variables: Sequence[Any]) -> Any | None:
    """The tf.distribute strategy whose variables these are, or ``None`` when none is distributed."""
    for variable in variables:
        if is_distributed(variable):
            return tf_variable(variable).distribute_strategy
    return None


def in_replicas(strategy: Any, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in replica context on every local replica; the first one's result."""
    return strategy.experimental_local_results(strategy.run(function, args=args))[0]


def result(metric: Any) -> Any:
    """``metric``'s result from its variables as this replica holds them (the class's own ``result``)."""
    return type(metric).result(metric)


def adds_over_workers(metric: Any) -> bool:
    """Whether every tf.distribute variable of ``metric`` aggregates by SUM (the copies add up to the state)."""
    import tensorflow as tf

    return all(
        tf_variable(v).aggregation == tf.VariableAggregation.SUM for v in metric.variables if is_distributed(v)
    )
