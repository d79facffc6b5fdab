"""Trainings for the divergence check and the per-rank health, one named scenario per run.

    horovodrun -np 2 -H localhost:2 --gloo python health_worker.py --out DIR --scenarios a,b,c

Each scenario is one fit (one run, tagged ``scenario``), in the order given:

* ``horovod-optimizer``: Horovod's ``DistributedOptimizer``, each rank on its own data. On Keras 3 it does not
  average the gradients: the ranks' weights part at the first step.
* ``no-broadcast``: gradients averaged, but every rank starts from its own random weights (no initial broadcast).
* ``averaged``: gradients averaged (the example's optimizer) and the initial weights broadcast: one model.
* ``busy-rank-1``: the averaged training with ``system_metrics=True``, while rank 1 burns CPU in a thread.

Each rank counts the collectives hvd-mlflow calls (its ``collectives.Horovod`` methods).
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import threading
import time
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
from common import Record, data, keras

import hvd_mlflow

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_cnn import averaging, broadcast_initial_weights  # noqa: E402

CALLS: collections.Counter = collections.Counter()


def count_collectives() -> None:
    from hvd_mlflow.every_rank.collectives import Horovod

    for name in ("allreduce_sum", "allgather", "allgather_object", "broadcast_object"):
        original = getattr(Horovod, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            CALLS[_name] += 1
            return _original(self, *args, **kwargs)

        setattr(Horovod, name, counted)


def model_for(scenario: str, rank: int):
    keras.utils.set_random_seed(rank if scenario == "no-broadcast" else 7)
    model = keras.Sequential(
        [keras.Input(shape=(8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1, "sigmoid")]
    )
    if scenario == "horovod-optimizer":
        import horovod.tensorflow.keras as hvd_keras

        optimizer = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.05))
    else:
        optimizer = averaging(keras.optimizers.SGD(0.05))
    model.compile(optimizer=optimizer, loss="binary_crossentropy", metrics=["accuracy"])
    if scenario in ("averaged", "busy-rank-1"):
        broadcast_initial_weights(model)
    return model


def burn(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(i * i for i in range(20_000))


def run(scenario: str, args: argparse.Namespace, record: Record) -> None:
    rank = hvd.rank()
    hvd_mlflow.autolog(system_metrics=scenario == "busy-rank-1", extra_tags={"scenario": scenario})
    model = model_for(scenario, rank)
    x, y = data(rank, 96)
    stop = threading.Event()
    if scenario == "busy-rank-1" and rank == 1:
        threading.Thread(target=burn, args=(stop,), daemon=True).start()

    class Sleep(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            time.sleep(args.epoch_sleep if scenario == "busy-rank-1" else 0)  # a few system samples per epoch

    CALLS.clear()
    model.fit(x, y, batch_size=16, epochs=args.epochs, verbose=0, callbacks=[Sleep()])
    stop.set()
    record.setdefault("fits", {})[scenario] = {
        "collectives": dict(CALLS),
        "weights": [np.asarray(w).ravel().tolist() for w in model.get_weights()],
    }
    record.save()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenarios", default="horovod-optimizer,averaged,busy-rank-1")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--epoch-sleep", type=float, default=1.5)
    args = parser.parse_args()
    hvd.init()
    logging.basicConfig(level=logging.WARNING, format=f"[rank {hvd.rank()}] %(name)s %(levelname)s: %(message)s")
    record = Record(args.out, hvd.rank())
    count_collectives()
    for scenario in args.scenarios.split(","):
        run(scenario, args, record)
    record["finished"] = True
    record.save()


if __name__ == "__main__":
    main()
