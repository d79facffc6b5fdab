"""What the test workers share: rank-dependent data, a small model, a spy on Keras' own local logs, the record.

The spy wraps Keras' ``CallbackList`` (the class Keras builds around ``fit``'s callbacks), so what it records
is what Keras computed on this rank before any callback, hvd-mlflow's included, ran: the independent truth the
tests compare the run with.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

keras = tf.keras
FLAVOUR = keras.Model.__module__.split(".", 1)[0]
keras_module = importlib.import_module(FLAVOUR)
KERAS_MAJOR = int(keras_module.__version__.split(".")[0])


def data(rank: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rank-dependent data, so every rank's local values differ (``seed`` 10: the validation shard)."""
    rng = np.random.default_rng(100 + rank + seed)
    x = rng.normal(loc=0.4 * rank, size=(n, 8)).astype("float32")
    y = (x.sum(axis=1) + rng.normal(size=n) > 0.5 * rank).astype("float32")
    return x, y


def small_model(learning_rate: float = 0.05, steps_per_execution: int = 1, seed: int = 7) -> Any:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input(shape=(8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1, "sigmoid")]
    )
    model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="binary_crossentropy", metrics=["accuracy"],
                  steps_per_execution=steps_per_execution)  # fmt: skip
    return model


class Record(dict):
    """What a rank writes to ``rank<R>.json`` in the output folder."""

    def __init__(self, out: Path, rank: int) -> None:
        super().__init__(flavour=FLAVOUR, keras_major=KERAS_MAJOR, rank=rank)
        self.path = out / f"rank{rank}.json"

    def save(self) -> None:
        self.path.write_text(json.dumps(self, default=float))


def spy_local_logs(record: Record, key: str = "local") -> None:
    """Record Keras' own epoch logs on this rank (before any callback) under ``record[key]``, one list per fit."""
    callback_list = keras_module.callbacks.CallbackList
    original_begin, original_end = callback_list.on_train_begin, callback_list.on_epoch_end

    def on_train_begin(self, logs=None):
        record.setdefault(key, []).append([])
        return original_begin(self, logs)

    def on_epoch_end(self, epoch, logs=None):
        record[key][-1].append({k: float(np.asarray(v)) for k, v in (logs or {}).items()})
        return original_end(self, epoch, logs)

    callback_list.on_train_begin = on_train_begin
    callback_list.on_epoch_end = on_epoch_end


class SeenLogs(keras.callbacks.Callback):
    """A user callback: what a later callback sees at each epoch end (the values hvd-mlflow wrote back), under
    ``record["seen"]``."""

    def __init__(self, record: dict) -> None:
        super().__init__()
        self.record = record

    def on_epoch_end(self, epoch, logs=None):
        self.record.setdefault("seen", []).append({k: float(np.asarray(v)) for k, v in (logs or {}).items()})


def weights(model: Any) -> list[list[float]]:
    return [np.asarray(w).ravel().tolist() for w in model.get_weights()]
