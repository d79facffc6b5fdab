"""What hvd-mlflow needs besides its own requirements, how to tell whether it is there, and the pip command that
installs it: the one place ``autolog()``, the callback and ``hvd-mlflow doctor`` take them from.

Keras, TensorFlow, JAX and Horovod are not requirements of the package (an image usually has its own, and Horovod
must be compiled against that TensorFlow); without any Keras hvd-mlflow says so, once, with the command to run.
TensorFlow is needed only where the model's Keras runs on it (tf_keras, Keras 2, Keras 3's TensorFlow backend).
Horovod is one of the engines (:mod:`hvd_mlflow.every_rank.collectives`), used where the job initialised it: a
tf.distribute or keras.distribution job, or one process, needs none (Horovod 0.28.1 does not build against
TensorFlow >= 2.19).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from ..errors import MissingDependencyError

KERAS = "pip install 'keras>=3' 'jax[cpu]'"
TENSORFLOW = "pip install 'tensorflow-cpu==2.16.2' && pip install --no-deps 'tf-keras==2.16.0'"
HOROVOD = ("CMAKE_POLICY_VERSION_MINIMUM=3.5 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 "
           "pip install --no-build-isolation --no-cache-dir 'horovod==0.28.1'")  # fmt: skip
HOROVOD_GLOO = "the same pip command with HOROVOD_WITH_GLOO=1: " + HOROVOD
MLFLOW = "pip install 'mlflow-skinny>=2.12.2'"  # compat.MLFLOW_FLOOR
AZUREML = "pip install 'hvd-mlflow[azureml]'"


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution (a pip package name), or ``None``."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def require_training_stack() -> None:
    """A Keras to train with: Keras 3 (on any backend: JAX, PyTorch or TensorFlow) or TensorFlow's tf_keras / Keras 2;
    else one error with the commands that install one (Horovod is asked for only where a job uses it)."""
    if importlib.util.find_spec("keras") is None and importlib.util.find_spec("tf_keras") is None:
        raise MissingDependencyError(
            f"hvd-mlflow needs Keras: {KERAS} (Keras 3 on JAX, PyTorch or TensorFlow), or TensorFlow ({TENSORFLOW}); "
            f"a Horovod job also needs Horovod, compiled against that TensorFlow ({HOROVOD})"
        )


def horovod_installed() -> bool:
    return importlib.util.find_spec("horovod") is not None


def require_mlflow() -> None:
    if importlib.util.find_spec("mlflow") is None:
        raise MissingDependencyError(f"hvd-mlflow needs the MLflow client: {MLFLOW} (or {AZUREML})")
