"""tf.distribute's metric variables, read and used on this worker alone: never one of the strategy's collectives.

Under a tf.distribute strategy Keras keeps each metric's state in SyncOnRead variables (aggregation SUM): one local
copy per replica. Reading one in cross-replica context, where ``fit``'s callbacks run (tf_keras runs them inside
``strategy.scope()``), sums the copies over every replica of every worker: a collective, which every worker must call
at the same point, and a sum hvd-mlflow would count again. tf_keras' ``metric.result()`` reaches the same collective
through a ``merge_call``, and an assign there writes ``value / replicas`` into each copy (and reads it back, the
collective again). hvd-mlflow needs each worker's own state (it sums the states over workers itself, once, in its
epoch collective) and the results of a given state on this worker alone, so here:

* :func:`parts`: those of a variable's local copies (``.values``) that add up to this worker's value, read
  directly: no collective;
* :func:`in_replicas`: a function run in replica context (``strategy.run``), where an assign writes this replica's
  copy and a read reads it; the first local replica's result;
* :func:`result`: a metric's own ``result`` (the class's: not tf_keras' ``merge_call`` wrapper on the instance);
* :func:`adds_over_workers`: whether a metric's state is each replica's own part (SyncOnRead copies: they add up
  over workers as the states of Horovod's ranks do, whatever aggregation Keras reads them with), or kept in step by
  the strategy (a MirroredVariable: each copy holds the total).

Outside tf.distribute (Horovod, one process) every function leaves the variables as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

_EAGER_RUN_WARNING = "eagerly has significant overhead"  # tf.distribute's mirrored_run, on an eager strategy.run


def tf_variable(variable: Any) -> Any:
    """The TensorFlow variable behind a metric variable (Keras 3 wraps one; tf_keras' are TensorFlow's)."""
    inner = getattr(variable, "value", None)
    return inner if type(variable).__module__.startswith("keras") and hasattr(inner, "assign") else variable


def is_distributed(variable: Any) -> bool:
    """Whether ``variable`` is a tf.distribute variable (one copy per replica)."""
    import tensorflow as tf

    return isinstance(tf_variable(variable), tf.distribute.DistributedValues)


def parts(variable: Any) -> list[Any]:
    """The local copies that add up to this worker's value of ``variable`` (this process's own: one per local
    replica, reading them is no collective): all of them (each replica's own part), or the first one of a variable
    the strategy keeps in step (each copy holds the total); outside tf.distribute the variable itself."""
    inner = tf_variable(variable)
    if not is_distributed(inner):
        return [inner]
    return list(inner.values)[:1] if kept_in_step(variable) else list(inner.values)


def strategy_of(variables: Sequence[Any]) -> Any | None:
    """The tf.distribute strategy whose variables these are, or ``None`` when none is distributed."""
    for variable in variables:
        if is_distributed(variable):
            return tf_variable(variable).distribute_strategy
    return None


def in_replicas(strategy: Any, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in replica context on every local replica; the first one's result.

    Run eagerly (until hvd-mlflow's compiled functions are ready: :mod:`~hvd_mlflow.every_rank.tracing`), which
    makes TensorFlow warn "Using CollectiveAllReduceStrategy eagerly has significant overhead", about a call of a
    few milliseconds per epoch that is not the user's: that warning is dropped during this call."""
    tf_logger = logging.getLogger("tensorflow")
    tf_logger.addFilter(_quiet_eager_run)
    try:
        return strategy.experimental_local_results(strategy.run(function, args=args))[0]
    finally:
        tf_logger.removeFilter(_quiet_eager_run)


def _quiet_eager_run(record: logging.LogRecord) -> bool:
    return _EAGER_RUN_WARNING not in record.getMessage()


def result(metric: Any) -> Any:
    """``metric``'s result from its variables as this replica holds them (the class's own ``result``)."""
    return type(metric).result(metric)


def kept_in_step(variable: Any) -> bool:
    """Whether tf.distribute keeps every copy of ``variable`` equal (written through all-reduces: ON_WRITE, a
    MirroredVariable), so that each copy holds the total over replicas rather than its own part."""
    import tensorflow as tf

    inner = tf_variable(variable)
    return is_distributed(inner) and inner.synchronization != tf.VariableSynchronization.ON_READ


def adds_over_workers(metric: Any) -> bool:
    """Whether ``metric``'s state is each replica's own part (SyncOnRead copies, as Keras makes them), so that the
    parts add up over workers; a metric whose variables tf.distribute keeps in step holds the total everywhere."""
    return not any(kept_in_step(v) for v in metric.variables)
