"""One process of a ``keras.distribution`` job on Keras 3's JAX backend, as users launch it.

    python jax_worker.py --launch explicit --coordinator 127.0.0.1:PORT --process-id I --out DIR [--scenarios ...]
    KERAS_DISTRIBUTION_JOB_ADDRESSES=... KERAS_DISTRIBUTION_NUM_PROCESSES=2 KERAS_DISTRIBUTION_PROCESS_ID=I \\
        python jax_worker.py --launch env --out DIR
    mpirun -np 2 python jax_worker.py --launch mpirun --out DIR

Every process joins the others (``keras.distribution.initialize`` with explicit addresses, with the
``KERAS_DISTRIBUTION_*`` variables, or with nothing under mpirun), trains ``DataParallel`` on its own shard
(``auto_shard_dataset = False``) with ``hvd_mlflow.autolog(log_every_n_steps=1)``, and writes ``process<I>.json``:
per scenario what its later callbacks saw (each batch's and epoch's logs), and on process 0 the weights (learning
rate 0: they never move, so every value is the metric of those weights on the data seen so far). The truth is
computed apart from all of this by :func:`truth` in one plain process on the union of every process's data.

Each scenario logs into the run the test created for it: ``mlflow.start_run(run_id=...)`` and a user's
``mlflow.log_metric`` on every process, as a user's script does (process 0's calls reach the run, the others' are
stood in for).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

PROCESSES = 2
TRAIN, VAL, BATCH = 48, 24, 16  # per process: 3 training steps of 16, validation in batches of 16 and 8


class MaxAbsError(keras.metrics.Metric):
    """A user's own metric: a running maximum, whose state does not add up (a max, not a sum)."""

    def __init__(self, name: str = "max_err", **kwargs) -> None:
        super().__init__(name=name, **kwargs)
        self.worst = self.add_variable(shape=(), initializer="zeros", name="worst")

    def update_state(self, y_true, y_pred, sample_weight=None):
        ops = keras.ops
        err = ops.max(ops.abs(ops.cast(ops.reshape(y_true, [-1]), "float32") - ops.reshape(y_pred, [-1])))
        self.worst.assign(ops.maximum(self.worst.value, err))

    def result(self):
        return self.worst.value

    def reset_state(self):
        self.worst.assign(0.0)


def features(process: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * seed + process)
    return rng.normal(loc=0.3 * process, size=(n, 8)).astype("float32")


def binary_labels(x: np.ndarray, process: int) -> np.ndarray:
    return (x.sum(axis=1) + 0.7 * np.sin(3 * x[:, 0]) > 0.4 * process).astype("float32")


def dense_model(outputs: dict[str, tuple[int, str | None]]) -> keras.Model:
    keras.utils.set_random_seed(11)
    inputs = keras.Input(shape=(8,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    heads = {n: keras.layers.Dense(u, activation=a, name=n)(hidden) for n, (u, a) in outputs.items()}
    return keras.Model(inputs, heads if len(heads) > 1 else next(iter(heads.values())))


def weighted() -> tuple[keras.Model, object]:
    """AUC, precision, recall, a custom metric, and sample weights (a weighted metric too)."""
    model = dense_model({"o": (1, "sigmoid")})
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="binary_crossentropy",
                  metrics=["accuracy", keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision"),
                           keras.metrics.Recall(name="recall"), MaxAbsError()],
                  weighted_metrics=[keras.metrics.BinaryAccuracy(name="w_acc")])  # fmt: skip

    def data(process: int, n: int, seed: int):
        x = features(process, n, seed)
        return x, binary_labels(x, process)[:, None], (1.0 + np.abs(x[:, 2])).astype("float32")

    return model, data


def multi_output() -> tuple[keras.Model, object]:
    """Two heads, weighted losses, metrics per head."""
    model = dense_model({"a": (1, "sigmoid"), "b": (1, None)})
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss={"a": "binary_crossentropy", "b": "mse"},
                  loss_weights={"a": 1.0, "b": 0.5},
                  metrics={"a": ["accuracy", keras.metrics.AUC(name="auc"), keras.metrics.Recall(name="recall")],
                           "b": ["mae", MaxAbsError()]})  # fmt: skip

    def data(process: int, n: int, seed: int):
        x = features(process, n, seed)
        return x, {"a": binary_labels(x, process)[:, None], "b": x[:, :3].sum(axis=1, keepdims=True) * 0.5}, None

    return model, data


def small() -> tuple[keras.Model, object]:
    """The launch tests' fit: one metric, one short fit."""
    model = dense_model({"o": (1, "sigmoid")})
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="binary_crossentropy", metrics=["accuracy"])

    def data(process: int, n: int, seed: int):
        x = features(process, n, seed)
        return x, binary_labels(x, process)[:, None], None

    return model, data


SCENARIOS = {"weighted": weighted, "multi_output": multi_output, "small": small}


def arrays(data, process: int) -> tuple[tuple, tuple]:
    """``(x, y, w)`` for training and validation: this process's own samples."""
    return data(process, TRAIN, seed=1), data(process, VAL, seed=2)


class Seen(keras.callbacks.Callback):
    """What the callbacks after hvd-mlflow's see: every batch's and epoch's logs."""

    def __init__(self, pause: float = 0.0) -> None:
        super().__init__()
        self.pause = pause  # seconds after each batch: epochs long enough for the system sampler's readings
        self.batches: list[dict[str, float]] = []
        self.epochs: list[dict[str, float]] = []
        self.rss_mb: list[float] = []  # this process's resident memory at each epoch's end

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.pause)
        self.batches.append({k: float(v) for k, v in (logs or {}).items()})

    def on_epoch_end(self, epoch, logs=None):
        import psutil

        self.epochs.append({k: float(v) for k, v in (logs or {}).items()})
        self.rss_mb.append(psutil.Process().memory_info().rss / 2**20)


def start(args: argparse.Namespace) -> tuple[int, int]:
    import jax

    if args.launch == "explicit":
        keras.distribution.initialize(job_addresses=args.coordinator, num_processes=PROCESSES,
                                      process_id=args.process_id)  # fmt: skip
    elif args.launch in ("env", "mpirun"):
        keras.distribution.initialize()  # the KERAS_DISTRIBUTION_* variables, or JAX's own Open MPI detection
    if args.launch != "none" and not args.no_distribution:
        parallel = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
        parallel.auto_shard_dataset = args.auto_shard  # False: each process passes its own shard
        keras.distribution.set_distribution(parallel)
    return jax.process_index(), jax.process_count()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launch", choices=("explicit", "env", "mpirun", "none"), required=True)
    parser.add_argument("--coordinator", default="")
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scenarios", default="small")
    parser.add_argument("--runs", default="", help="scenario=run_id,...: the runs the test created")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds to wait after each batch")
    parser.add_argument("--auto-shard", action="store_true", help="leave Keras' auto_shard_dataset on (arrays)")
    parser.add_argument("--no-distribution", action="store_true", help="initialise, but set no distribution")
    parser.add_argument("--train", type=int, default=TRAIN, help="this process's training samples")
    args = parser.parse_args()
    process, count = start(args)

    import mlflow

    import hvd_mlflow

    hvd_mlflow.autolog(log_every_n_steps=1)
    runs = dict(item.split("=", 1) for item in args.runs.split(",") if item)
    record: dict = {"process": process, "processes": count, "scenarios": {}}
    for name in args.scenarios.split(","):
        model, data = SCENARIOS[name]()
        (x, y, w), validation = arrays(data, process)
        if args.train != TRAIN:  # uneven shards: this process's first samples only
            x, y, w = x[: args.train], y[: args.train], None if w is None else w[: args.train]
        seen = Seen(args.pause)
        with mlflow.start_run(run_id=runs.get(name)):
            model.fit(x, y, sample_weight=w, batch_size=BATCH, epochs=args.epochs, validation_data=validation,
                      callbacks=[seen], shuffle=False, verbose=0)  # fmt: skip
            mlflow.log_metric("user_metric", 10.0 + process)  # every process calls it: process 0's reaches the run
        record["scenarios"][name] = {"batches": seen.batches, "epochs": seen.epochs, "rss_mb": seen.rss_mb}
        if process == 0:
            np.savez(args.out / f"weights-{name}.npz", *model.get_weights())
    (args.out / f"process{process}.json").write_text(json.dumps(record))


def truth(out: Path, name: str, epochs_seen: int) -> dict:
    """One plain process (no distribution), the same weights, the union of every process's data: each epoch's
    values (training and validation), and the running training values after each global batch."""
    model, data = SCENARIOS[name]()
    with np.load(out / f"weights-{name}.npz") as saved:
        model.set_weights([saved[f"arr_{i}"] for i in range(len(saved.files))])
    shards = [arrays(data, p) for p in range(PROCESSES)]

    def union(parts: list[tuple], rows: slice) -> tuple:
        x = np.concatenate([p[0][rows] for p in parts])
        y0 = parts[0][1]
        y = ({k: np.concatenate([p[1][k][rows] for p in parts]) for k in y0} if isinstance(y0, dict)
             else np.concatenate([p[1][rows] for p in parts]))  # fmt: skip
        w = np.concatenate([p[2][rows] for p in parts]) if parts[0][2] is not None else None
        return x, y, w

    def evaluate(x, y, w) -> dict[str, float]:
        values = model.evaluate(x, y, sample_weight=w, batch_size=len(x), verbose=0, return_dict=True)
        return {k: float(v) for k, v in values.items()}

    train = evaluate(*union([s[0] for s in shards], slice(None)))
    val = evaluate(*union([s[1] for s in shards], slice(None)))
    epoch = {**train, **{f"val_{k}": v for k, v in val.items()}}
    steps = -(-TRAIN // BATCH)
    batches = [evaluate(*union([s[0] for s in shards], slice(0, BATCH * (k + 1)))) for k in range(steps)]
    return {"epoch": epoch, "batches": batches * epochs_seen}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--truth"]:  # --truth OUT EPOCHS SCENARIO...: every scenario's truth, in one process
        out, epochs = Path(sys.argv[2]), int(sys.argv[3])
        print(json.dumps({name: truth(out, name, epochs) for name in sys.argv[4:]}))
    else:
        main()
