"""A small Keras CNN on scikit-learn's handwritten digits, trained with Horovod and logged with hvd-mlflow.

    horovodrun -np 2 -H localhost:2 --gloo python examples/train_cnn.py --epochs 8

Works with Keras 3 (TensorFlow >= 2.16), with the legacy tf_keras (``TF_USE_LEGACY_KERAS=1``, the AzureML
default) and with TensorFlow 2.15's Keras 2. Nothing is downloaded: the 1,797 8x8 digits ship inside
scikit-learn.
"""

from __future__ import annotations

import argparse
import logging

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvd_mlflow


def shard(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """This rank's share of the data: every size-th sample, the same count on every rank (so that every
    rank runs the same number of steps and the gradient allreduces line up)."""
    n = len(x) // hvd.size() * hvd.size()
    return x[hvd.rank() : n : hvd.size()], y[hvd.rank() : n : hvd.size()]


def averaging(optimizer: tf.keras.optimizers.Optimizer) -> tf.keras.optimizers.Optimizer:
    """``optimizer`` averaging gradients over all ranks before applying them.

    Horovod's own ``DistributedOptimizer`` works with tf_keras and Keras 2 but, on Keras 3, silently does
    not average; this wrapper does the same thing in every Keras flavour.
    """

    class Averaging(type(optimizer)):
        def apply_gradients(self, grads_and_vars, *args, **kwargs):
            grads_and_vars = [(hvd.allreduce(g, op=hvd.Average), v) for g, v in grads_and_vars]
            return super().apply_gradients(grads_and_vars, *args, **kwargs)

    Averaging.__name__ = Averaging.__qualname__ = "Distributed" + type(optimizer).__name__
    return Averaging.from_config(optimizer.get_config())


def build_model(learning_rate: float) -> tf.keras.Model:
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(8, 8, 1)),
            tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dropout(0.25),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]
    )
    # The usual Horovod recipe: scale the learning rate by the number of ranks.
    model.compile(
        optimizer=averaging(tf.keras.optimizers.Adam(learning_rate * hvd.size())),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def broadcast_initial_weights(model: tf.keras.Model) -> None:
    """Start every rank from rank 0's weights (works in every Keras flavour, unlike Horovod's callback)."""
    model.set_weights(hvd.broadcast_object(model.get_weights(), root_rank=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="also Keras' TensorBoard callback (on every rank, as "
        "any callback: hvd-mlflow keeps rank 0's, and uploads its folder into the run)",
    )
    args = parser.parse_args()

    hvd.init()
    logging.basicConfig(level=logging.INFO, format=f"[rank {hvd.rank()}] %(name)s: %(message)s")
    hvd_mlflow.autolog()

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int64")
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)

    tf.keras.utils.set_random_seed(hvd.rank())
    model = build_model(args.learning_rate)
    broadcast_initial_weights(model)
    model.fit(
        *shard(x_train, y_train),
        validation_data=shard(x_val, y_val),
        epochs=args.epochs,
        batch_size=args.batch_size,
        verbose=2 if hvd.rank() == 0 else 0,
        callbacks=[tf.keras.callbacks.TensorBoard(args.tensorboard)] if args.tensorboard else None,
    )


if __name__ == "__main__":
    main()
