"""The end of scripts/setup-env.sh: the pinned stack imports together (Horovod against this TensorFlow)."""

from __future__ import annotations

import sys

import horovod
import horovod.tensorflow  # noqa: F401 - importing it is the check: a Horovod built against another TF fails here
import mlflow
import numpy
import tensorflow as tf

print(f"tensorflow {tf.__version__} | horovod {horovod.__version__} | mlflow {mlflow.__version__} | numpy "
      f"{numpy.__version__}", file=sys.stderr)  # fmt: skip
