"""The digits CNN of train_cnn.py, trained with tf.distribute's MultiWorkerMirroredStrategy and logged with hvd-mlflow.

Shaped as AzureML's own tf.distribute example (azureml-examples, cli/jobs/single-step/tensorflow/mnist-distributed:
the strategy, the dataset batched at the global batch size, the model built and compiled inside ``strategy.scope()``,
``fit`` with ``steps_per_epoch``, the model saved by every worker), with ``hvd_mlflow.autolog()`` added after the
strategy is made. AzureML's ``distribution: type: tensorflow`` writes ``TF_CONFIG`` for each worker
(examples/azureml/job-tfdistribute.yml); on one machine, start one process per worker yourself:

    TF_USE_LEGACY_KERAS=1 TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:23456", "127.0.0.1:23457"]},
        "task": {"type": "worker", "index": 0}}' python examples/train_cnn_tfdistribute.py &
    # ... and the same with "index": 1

Needs tf_keras (``TF_USE_LEGACY_KERAS=1``): Keras 3 cannot train with this strategy (keras-team/keras#20585), and
hvd-mlflow says so before training. Nothing is downloaded: the 1,797 8x8 digits ship inside scikit-learn.
"""

from __future__ import annotations

import argparse
import json
import logging
import os

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import hvd_mlflow


def digits_dataset(global_batch_size: int) -> tf.data.Dataset:
    digits = load_digits()
    x = (digits.images / np.float32(16)).astype("float32")[..., None]
    y = digits.target.astype("int64")
    # every worker reads the same files; the strategy shards the dataset over the workers (by data, as it does)
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).repeat().batch(global_batch_size)


def build_and_compile_cnn_model() -> tf.keras.Model:
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(8, 8, 1)),
            tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.Adam(learning_rate=0.003),
        metrics=["accuracy"],
    )
    return model


def is_chief(task_type: str | None, task_id: int | None) -> bool:
    return task_type is None or task_type == "chief" or (task_type == "worker" and task_id == 0)


def write_filepath(filepath: str, task_type: str | None, task_id: int | None) -> str:
    """The chief saves into ``filepath``; the other workers into a folder of their own (as Azure's example)."""
    dirpath, base = os.path.split(filepath)
    if not is_chief(task_type, task_id):
        dirpath = os.path.join(dirpath, f"workertemp_{task_id}")
        tf.io.gfile.makedirs(dirpath)
    return os.path.join(dirpath, base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--steps-per-epoch", type=int, default=12)
    parser.add_argument("--per-worker-batch-size", type=int, default=64)
    parser.add_argument("--model-dir", default="outputs/keras-model", help="where to save the model")
    parser.add_argument(
        "--collective-timeout",
        type=float,
        metavar="S",
        help="give up a collective after S seconds (CommunicationOptions): see docs/reliability.md",
    )
    args = parser.parse_args()

    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    cluster = tf_config.get("cluster", {})
    num_workers = max(1, len(cluster.get("chief", [])) + len(cluster.get("worker", [])))
    task_type, task_id = tf_config.get("task", {}).get("type"), tf_config.get("task", {}).get("index")
    logging.basicConfig(format=f"%(asctime)s [{task_type or 'solo'} {task_id or 0}] %(name)s: %(message)s")
    logging.getLogger("hvd_mlflow").setLevel(logging.INFO)  # what hvd-mlflow says; TensorFlow's own stays at WARNING

    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=args.collective_timeout)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    hvd_mlflow.autolog()  # on every worker: the chief alone logs the global values, one point per epoch

    multi_worker_dataset = digits_dataset(args.per_worker_batch_size * num_workers)
    with strategy.scope():  # the model must be built and compiled inside the strategy's scope
        multi_worker_model = build_and_compile_cnn_model()
    multi_worker_model.fit(
        multi_worker_dataset,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        verbose=2 if is_chief(task_type, task_id) else 0,
    )
    multi_worker_model.save(write_filepath(args.model_dir, task_type, task_id))


if __name__ == "__main__":
    main()
