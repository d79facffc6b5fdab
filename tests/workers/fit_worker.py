"""A real distributed Keras training for the tests: each rank fits on its own data with hvd-mlflow.

Each rank writes ``rank<R>.json`` into ``--out`` with what the tests compare against:
* ``local``: Keras' own epoch logs as Keras computed them on this rank, recorded by a spy on Keras'
  ``CallbackList.on_epoch_end`` before any callback (hvd-mlflow's included) runs: the independent truth;
* ``history``: what ``model.history`` (the last callback) recorded: must be the global values;
* ``run_id``: the run id hvd-mlflow's callback holds on this rank after the broadcast.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import hvd_mlflow

keras = tf.keras
flavour = keras.Model.__module__.split(".", 1)[0]
keras_module = importlib.import_module(flavour)
record: dict = {"local": [], "flavour": flavour}


def spy_on_epoch_end() -> None:
    callback_list = keras_module.callbacks.CallbackList
    original = callback_list.on_epoch_end

    def on_epoch_end(self, epoch, logs=None):
        record["local"].append({k: float(np.asarray(v)) for k, v in (logs or {}).items()})
        for cb in self.callbacks:
            if isinstance(cb, hvd_mlflow.HorovodMlflowCallback):
                record["run_id"] = cb.run_id
        return original(self, epoch, logs)

    callback_list.on_epoch_end = on_epoch_end


def data(rank: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank-dependent data, so every rank's local values differ."""
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(loc=0.4 * rank, size=(n, 8)).astype("float32")
    y = (x.sum(axis=1) + rng.normal(size=n) > 0.5 * rank).astype("float32")
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--explicit-callback", action="store_true", help="pass the callback, no autolog")
    parser.add_argument("--mismatch", action="store_true", help="rank 1 compiles one more metric")
    parser.add_argument("--no-validation", action="store_true")
    args = parser.parse_args()

    hvd.init()
    rank = hvd.rank()
    if not args.explicit_callback:
        hvd_mlflow.autolog()
    spy_on_epoch_end()
    keras.utils.set_random_seed(7)

    metrics = ["accuracy"] + (["mae"] if args.mismatch and rank == 1 else [])
    model = keras.Sequential(
        [keras.Input(shape=(8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1, "sigmoid")]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy", metrics=metrics)
    x, y = data(rank, args.samples)
    xv, yv = data(rank + 10, args.samples // 2)
    callbacks = [hvd_mlflow.HorovodMlflowCallback(model=model)] if args.explicit_callback else []
    history = model.fit(
        x,
        y,
        batch_size=16,
        epochs=args.epochs,
        validation_data=None if args.no_validation else (xv, yv),
        callbacks=callbacks,
        verbose=0,
    )
    record["history"] = {k: [float(v) for v in vs] for k, vs in history.history.items()}
    record["size"] = hvd.size()
    record["pid"] = os.getpid()
    (args.out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
