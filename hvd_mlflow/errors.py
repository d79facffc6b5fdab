"""The errors hvd-mlflow raises to users. During training each is raised on every rank at the same point, never by one
rank alone; a missing dependency is raised before training starts."""

from __future__ import annotations


class HvdMlflowError(Exception):
    """Base class of every error hvd-mlflow raises (catch this to handle any of them)."""


class MetricKeyMismatchError(HvdMlflowError, RuntimeError):
    """Ranks reported different metric keys at the same epoch end, so their values cannot be combined."""


class MetricNameCollisionError(HvdMlflowError, ValueError):
    """Two logged metric names become the same once made acceptable to the tracking server."""


class OptionsMismatchError(HvdMlflowError):
    """Ranks were given different options that decide which collectives run."""


class LauncherMismatchError(HvdMlflowError):
    """The launcher started more processes than the training sees (Horovod without MPI, or with another MPI, under an
    MPI launcher; ``TF_CONFIG`` naming several workers for a model built outside a multi-worker ``strategy.scope()``):
    each process would train alone as rank 0 and log its own values into the job's run. Raised by every process at
    train begin."""


class EmptyShardError(HvdMlflowError, ValueError):
    """Some rank's training or validation data is empty (:mod:`hvd_mlflow.every_rank.shards`); raised by every rank at
    train begin."""


class ShardMismatchError(HvdMlflowError, ValueError):
    """Under ``keras.distribution``, the processes' batches differ in size (different sample counts, batch sizes or
    steps), which JAX's global batch cannot join; under Horovod, the ranks' training steps per epoch differ, which
    the gradient averaging of each step cannot join (:mod:`hvd_mlflow.every_rank.shards`). Raised by every process
    at train begin."""


class MissingDependencyError(HvdMlflowError, ImportError):
    """TensorFlow, Horovod or MLflow cannot be imported here; the message names the pip command that installs it."""
