"""The end of scripts/setup-env.sh: the pinned stack imports together (Horovod against this TensorFlow), and Horovod
has the controllers the environment promises (``check_environment.py mpi-gloo``: MPI and Gloo; ``none``: a row
without Horovod, where it must not be importable); in the JAX row, Keras 3 on JAX without TensorFlow."""

from __future__ import annotations

import importlib.util
import sys

import mlflow
import numpy

if importlib.util.find_spec("tensorflow") is None:  # the JAX row: Keras 3 on JAX, and nothing of TensorFlow
    import os

    os.environ.setdefault("KERAS_BACKEND", "jax")  # Keras 3's default backend is TensorFlow's
    import jax
    import keras

    if importlib.util.find_spec("horovod") is not None:
        sys.exit("horovod is installed in a row that must run without it")
    print(f"keras {keras.__version__} on jax {jax.__version__} | no tensorflow, no horovod | mlflow "
          f"{mlflow.__version__} | numpy {numpy.__version__}", file=sys.stderr)  # fmt: skip
    sys.exit(0)

import tensorflow as tf  # noqa: E402

if len(sys.argv) > 1 and sys.argv[1] == "none":
    if importlib.util.find_spec("horovod") is not None:
        sys.exit("horovod is installed in a row that must run without it")
    print(f"tensorflow {tf.__version__} | no horovod | mlflow {mlflow.__version__} | numpy {numpy.__version__}",
          file=sys.stderr)  # fmt: skip
    sys.exit(0)

import horovod  # noqa: E402
import horovod.tensorflow  # noqa: E402 - importing it is the check: a Horovod built against another TF fails here

print(f"tensorflow {tf.__version__} | horovod {horovod.__version__} | mlflow {mlflow.__version__} | numpy "
      f"{numpy.__version__}", file=sys.stderr)  # fmt: skip

wanted = set(sys.argv[1].split("-")) if len(sys.argv) > 1 else {"gloo"}
built = {
    name for name, check in (("mpi", horovod.tensorflow.mpi_built), ("gloo", horovod.tensorflow.gloo_built)) if check()
}
if wanted - built:
    sys.exit(f"horovod lacks the {', '.join(sorted(wanted - built))} controller (built: {', '.join(sorted(built))})")
