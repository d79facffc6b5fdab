"""The engine: the few collectives hvd-mlflow needs, on the training's own communication layer.

Which one (:func:`for_fit`), the same on every process by construction (rule 2):

* :class:`Horovod` when Horovod is initialised with more than one process: ``horovod.tensorflow``'s ``allreduce``,
  ``allgather``, ``allgather_object`` and ``broadcast_object`` (Horovod's Keras layer is broken on Keras 3);
* else :class:`TfDistribute` when the model's ``distribute_strategy`` spans several workers (MultiWorkerMirrored,
  collective all-reduce, as AzureML's ``distribution: type: tensorflow`` jobs run it): the strategy's own
  cross-worker collectives carry everything, with no second communication layer. Its workers are ranked as
  tf.distribute ranks them (the chief is rank 0: :func:`hvd_mlflow.common.topology.rank_in_cluster`);
* else :class:`Jax` when the model is Keras 3 on JAX and JAX's multi-process runtime runs more than one process
  (``keras.distribution.initialize()``, with ``DataParallel`` or ``ModelParallel``): Keras computes every step on the
  global batch, so its values are global already and nothing is summed; JAX's own multi-process gather
  (``jax.experimental.multihost_utils``) carries what rides along. Process 0 is rank 0;
* else :class:`Solo`: one process, nothing is communicated.

Every process of a job runs the same code with the same launcher and the same model, so every process picks the
same engine.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from ..common import topology
from ..errors import HvdMlflowError, LauncherMismatchError
from . import keras_flavour


class Solo:
    """One process: every collective is the identity. The base of every engine (its defaults, and
    :meth:`broadcast_object` as rank 0's object out of :meth:`allgather_object`)."""

    rank = 0
    size = 1
    engine = "single process"  # which communication layer, as hvd-mlflow names it: "horovod", "tf.distribute", ...
    # Keras' logs hold every rank's global values already (tf.distribute reads metric states summed over workers):
    # each rank's own values are computed from its own metric state where a reduction needs them
    logs_are_global = False
    # the engine itself keeps every rank's weights equal (tf.distribute's mirrored variables): no fingerprint check
    keeps_weights_in_step = False
    # fit's batch_size is the global batch, which the engine splits over ranks (tf.distribute), not each rank's
    batch_is_global = False
    # saving the model runs the engine's collectives (tf.distribute's mirrored variables): rank 0 cannot save alone
    saving_is_collective = False
    # Keras' values are computed on the global batch (keras.distribution on JAX): nothing to reduce, none per rank
    values_are_global = False

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        return values

    def allgather(self, values: np.ndarray, name: str) -> np.ndarray:
        return values

    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        return [obj]

    def broadcast_object(self, obj: Any, name: str) -> Any:
        return self.allgather_object(obj if self.rank == 0 else None, name)[0]


Collectives = Solo  # the type of every engine


class Horovod(Solo):
    """The collectives of an initialised ``horovod.tensorflow``."""

    engine = "horovod"

    def __init__(self, hvd: Any) -> None:
        self._hvd = hvd
        self.rank = hvd.rank()
        self.size = hvd.size()

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        out = self._hvd.allreduce(np.ascontiguousarray(values), op=self._hvd.Sum, name=name)
        return np.asarray(out.numpy() if hasattr(out, "numpy") else out, dtype=values.dtype)

    def allgather(self, values: np.ndarray, name: str) -> np.ndarray:
        """Every rank's 1-D ``values``, concatenated in rank order (lengths may differ)."""
        out = self._hvd.allgather(np.ascontiguousarray(values), name=name)
        return np.asarray(out.numpy() if hasattr(out, "numpy") else out, dtype=values.dtype)

    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        return list(self._hvd.allgather_object(obj, name=name))

    def broadcast_object(self, obj: Any, name: str) -> Any:
        return self._hvd.broadcast_object(obj, root_rank=0, name=name)


class TfDistribute(Solo):
    """The collectives of a multi-worker ``tf.distribute`` strategy, each worker counted once.

    ``strategy.reduce`` of a plain tensor (not a per-replica value) goes to the strategy's host collective, whose
    group is the workers: a float64 sum-allreduce over workers, however many replicas each has (5 ms for 20 values
    between two CPU workers here). Gathers are sums of a matrix in which each worker fills its own row (one
    collective, the same shape on every worker); objects travel pickled, their lengths gathered first. The calls
    must come in the same order on every worker (rule 2), as every collective of the strategy's own: a worker that
    does not call hangs the others until ``CommunicationOptions(timeout_seconds=...)``, and workers whose vectors
    differ in length all fail at once (the strategy then aborts every later collective).
    """

    engine = "tf.distribute"
    logs_are_global = keeps_weights_in_step = batch_is_global = saving_is_collective = True

    def __init__(self, strategy: Any, rank: int, size: int) -> None:
        self._strategy = strategy
        self.rank, self.size = rank, size

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        import tensorflow as tf

        out = self._strategy.reduce(tf.distribute.ReduceOp.SUM, tf.constant(values, tf.float64), axis=None)
        return np.asarray(out.numpy(), dtype=values.dtype)

    def allgather(self, values: np.ndarray, name: str) -> np.ndarray:
        """Every worker's 1-D ``values``, concatenated in rank order (lengths may differ)."""
        return np.concatenate(self._ragged(values, name)).astype(values.dtype)

    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        rows = self._ragged(np.frombuffer(pickle.dumps(obj), dtype=np.uint8), name)
        return [pickle.loads(row.astype(np.uint8).tobytes()) for row in rows]

    def _ragged(self, values: np.ndarray, name: str) -> list[np.ndarray]:
        """Every worker's 1-D ``values`` (lengths may differ), as float64, in rank order: the lengths first, then
        the values padded to the longest."""
        lengths = self._rows(np.array([float(values.size)]), name).reshape(-1).astype(int)
        padded = np.zeros(int(lengths.max()), dtype=np.float64)
        padded[: values.size] = values
        return [row[:n] for row, n in zip(self._rows(padded, name), lengths, strict=True)]

    def _rows(self, values: np.ndarray, name: str) -> np.ndarray:
        """One row per worker, in rank order: each worker's ``values`` (all of the same length) in its own row of a
        zero matrix, summed over workers."""
        matrix = np.zeros((self.size, values.size), dtype=np.float64)
        matrix[self.rank] = values
        return self.allreduce_sum(matrix.reshape(-1), name).reshape(self.size, values.size)


class Jax(Solo):
    """JAX's processes under ``keras.distribution``, each process counted once (process 0 is rank 0).

    Everything travels through ``jax.experimental.multihost_utils.process_allgather``: each process's bytes, padded
    to one length, gathered into one row per process (the same call, in the same order, on every process: rule 2).
    Numbers travel as the bytes of their float64 (JAX computes in 32 bits unless x64 is on): every value arrives bit
    for bit, and every process sums the rows in rank order, so every process gets the same sum. Lengths are rounded
    up to a power of two so that JAX compiles its gather for a few shapes only.
    """

    engine = "keras.distribution"
    keeps_weights_in_step = saving_is_collective = values_are_global = True

    def __init__(self, jax: Any) -> None:
        from jax.experimental import multihost_utils

        self._gather = multihost_utils.process_allgather
        self.rank, self.size = int(jax.process_index()), int(jax.process_count())

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        return self._numbers(values).sum(axis=0).astype(values.dtype)

    def allgather(self, values: np.ndarray, name: str) -> np.ndarray:
        """Every process's 1-D ``values``, concatenated in rank order (lengths may differ)."""
        rows = self.allgather_object(np.asarray(values, dtype=np.float64), name)
        return np.concatenate(rows).astype(values.dtype)

    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        return [pickle.loads(row) for row in self._bytes(pickle.dumps(obj))]

    def _numbers(self, values: np.ndarray) -> np.ndarray:
        """One row per process of float64 ``values`` (the same length on every process), bit for bit."""
        words = np.ascontiguousarray(values, dtype=np.float64).view(np.uint32)
        rows = np.asarray(self._gather(_padded(words, words.size)))
        return np.ascontiguousarray(rows[:, : words.size]).view(np.float64)

    def _bytes(self, data: bytes) -> list[bytes]:
        """Every process's ``data`` (lengths may differ), in rank order: the lengths first, then the padded bytes."""
        lengths = np.asarray(self._gather(np.array([len(data)], dtype=np.int32))).reshape(-1)
        longest = int(lengths.max())
        raw = np.frombuffer(data, dtype=np.uint8)
        rows = np.asarray(self._gather(_padded(raw, longest)))
        return [rows[r, : int(n)].tobytes() for r, n in enumerate(lengths)]


def _padded(values: np.ndarray, length: int) -> np.ndarray:
    """``values`` with zeros after them up to the next power of two at or above ``length`` (at least 8)."""
    size = max(8, 1 << max(0, int(length) - 1).bit_length())
    out = np.zeros(size, dtype=values.dtype)
    out[: values.size] = values
    return out


def multi_worker_strategy(model: Any) -> tuple[Any, int, int] | None:
    """``(strategy, rank, size)`` when ``model`` trains under a tf.distribute strategy that spans several workers
    (MultiWorkerMirrored: collective all-reduce), else ``None``. From the model's own strategy and its cluster, the
    same on every worker."""
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None or type(getattr(strategy, "extended", None)).__name__ != "CollectiveAllReduceExtended":
        return None
    resolver = strategy.cluster_resolver
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    size = sum(len(cluster.get(kind, [])) for kind in topology.TRAINING_TASKS)
    if size <= 1:
        return None
    return strategy, topology.rank_in_cluster(cluster, resolver.task_type, int(resolver.task_id or 0)), size


def check_strategy(model: Any) -> None:
    """Raise :class:`~hvd_mlflow.errors.HvdMlflowError` for a Keras 3 model under a multi-worker strategy: Keras 3
    cannot train with MultiWorkerMirroredStrategy (keras-team/keras#20585: its ``fit`` fails at its first step, or,
    patched, logs each worker's own values). Every worker has the same model: raised by all alike, before training."""
    if multi_worker_strategy(model) is None or keras_flavour.of_model(model) != "keras":
        return
    if not keras_flavour.version("keras").startswith("3"):
        return
    raise HvdMlflowError(
        "hvd-mlflow: Keras 3 cannot train with MultiWorkerMirroredStrategy (keras-team/keras#20585), so this fit is "
        "refused on every worker. Use tf_keras, the Keras 2 that TensorFlow keeps for it: pip install "
        "tf-keras==<your TensorFlow's version> and set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (AzureML's "
        "TensorFlow images set it), then build the model with tf.keras."
    )


def for_fit(model: Any, allow_world_of_one: bool = False) -> Collectives:
    """The engine of one ``fit``: Horovod's collectives when it is initialised with more than one process, else
    ``model``'s multi-worker tf.distribute strategy's, else JAX's when ``model`` is on JAX and JAX runs several
    processes, else :class:`Solo`; after the checks every process makes alike from its launcher
    and its model: an MPI launcher's world larger than Horovod's, ``TF_CONFIG`` naming several workers for a model
    that trains alone, Keras 3 under a multi-worker strategy, a launcher's world that no engine joins, JAX's processes
    without a keras.distribution. Each raises on every process at train begin."""
    hvd = topology.horovod_if_initialised()
    if hvd is not None:
        topology.check_horovod_world(hvd.size(), mpi_built=hvd.mpi_built(), allowed=allow_world_of_one)
    check_strategy(model)
    strategy, jax = multi_worker_strategy(model), topology.jax_if_initialised()
    if hvd is not None and hvd.size() > 1:
        found: Collectives = Horovod(hvd)
    elif strategy is not None:
        found = TfDistribute(*strategy)
    elif jax is not None and keras_flavour.backend(model) == "jax":
        found = Jax(jax)
    else:
        found = Solo()
    own = getattr(model, "distribute_strategy", None)  # its class is named in the error
    strategy_name = type(own).__name__ if own is not None else "no strategy"
    topology.check_tf_config_world(found.size, strategy_name, allowed=allow_world_of_one)
    if hvd is None:
        topology.check_launcher_world(found.size, keras_flavour.backend(model), allowed=allow_world_of_one)
    if isinstance(found, Jax):
        import keras

        if keras.distribution.distribution() is None:
            # each process would train its own model on its own devices and data: raised by every process alike
            # (the same code), before training, unless allowed to train alone (each process a world of one)
            if not allow_world_of_one:
                raise LauncherMismatchError(
                    f"hvd-mlflow: JAX runs {found.size} processes (keras.distribution.initialize()), but no "
                    "keras.distribution is set, so each process would train its own model on its own data and log "
                    "it as rank 0. Set one before building the model: keras.distribution.set_distribution(keras."
                    "distribution.DataParallel(devices=keras.distribution.list_devices())), or pass "
                    "allow_world_of_one=True (HVD_MLFLOW_ALLOW_WORLD_OF_ONE=1) if each is meant to train alone."
                )
            return Solo()
    return found
