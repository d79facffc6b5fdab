"""The digits CNN of train_cnn.py, trained on Keras 3's JAX backend across processes with ``keras.distribution``.

Each process trains on its own shard of the data (``DataParallel`` with ``auto_shard_dataset = False``); JAX joins
the processes and computes every step, and every metric, on the global batch. ``hvd_mlflow.autolog()`` on every
process: process 0 alone logs, one point per metric per epoch (the values Keras reports are global already).

``keras.distribution.initialize()`` takes no arguments: under Open MPI's mpirun (AzureML's ``distribution: type:
mpi``, examples/azureml/job-jax.yml) JAX reads the processes' count, rank and coordinator from Open MPI's variables;
elsewhere set ``KERAS_DISTRIBUTION_JOB_ADDRESSES`` (process 0's ``host:port``), ``KERAS_DISTRIBUTION_NUM_PROCESSES``
and ``KERAS_DISTRIBUTION_PROCESS_ID``. On one machine:

    KERAS_BACKEND=jax mpirun -np 2 python examples/train_cnn_jax.py --epochs 8

Alone (no launcher, no ``KERAS_DISTRIBUTION_*``), it trains as one process. At the end every process prints the
curves its later callbacks saw (Keras' History): the same on every process. Nothing is downloaded: the 1,797 8x8
digits ship inside scikit-learn.
"""

from __future__ import annotations

import argparse
import json
import logging
import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # before Keras is imported; the job sets it too

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import hvd_mlflow  # noqa: E402

LAUNCHERS = ("OMPI_COMM_WORLD_SIZE", "KERAS_DISTRIBUTION_NUM_PROCESSES", "SLURM_NTASKS")


def start_processes() -> tuple[int, int]:
    """Join this process to the others (when a launcher started several) and train data-parallel over all of them:
    ``(process id, process count)``."""
    if any(name in os.environ for name in LAUNCHERS):
        keras.distribution.initialize()  # JAX detects mpirun; or the KERAS_DISTRIBUTION_* variables
    data_parallel = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
    data_parallel.auto_shard_dataset = False  # each process passes its own arrays (its shard)
    keras.distribution.set_distribution(data_parallel)
    return jax.process_index(), jax.process_count()


def shard(x: np.ndarray, y: np.ndarray, index: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """This process's share of the data: every count-th sample, the same number on every process (every process
    runs the same steps, as JAX's global batch needs)."""
    n = len(x) // count * count
    return x[index:n:count], y[index:n:count]


def build_model(learning_rate: float) -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input(shape=(8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.25),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per process (the global batch is the sum)")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    args = parser.parse_args()

    index, count = start_processes()
    logging.basicConfig(format=f"[process {index}] %(name)s: %(message)s")
    logging.getLogger("hvd_mlflow").setLevel(logging.INFO)
    hvd_mlflow.autolog()  # on every process: process 0 alone logs

    digits = load_digits()
    x = (digits.images / np.float32(16)).astype("float32")[..., None]
    y = digits.target.astype("int64")
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)

    keras.utils.set_random_seed(0)  # the same initial weights on every process (one global array anyway)
    model = build_model(args.learning_rate)
    history = model.fit(
        *shard(x_train, y_train, index, count),
        validation_data=shard(x_val, y_val, index, count),
        epochs=args.epochs,
        batch_size=args.batch_size,
        verbose=2 if index == 0 else 0,
    )
    print(f"process {index} of {count}, history: {json.dumps(history.history)}", flush=True)


if __name__ == "__main__":
    main()
