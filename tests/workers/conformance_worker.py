"""Every metric a Keras user compiles, against a one-process evaluation of the same weights on all ranks' samples.

    horovodrun -np 2 -H localhost:2 --gloo python conformance_worker.py --out DIR [--scenarios a,b] [--golden]

Each scenario trains with a learning rate of 0 (the weights never move, so every epoch's metrics are the metrics
of those weights on the rank's shard) on uneven, rank-dependent shards, with ``hvd_mlflow.autolog()``; then rank 0
evaluates the same weights in one process on the union of every rank's samples (``model.evaluate``): the truth,
computed without hvd-mlflow. Rank ``R`` writes ``rank<R>.json``: per scenario the History (the global values
every rank's callbacks saw), Keras' own local values and sample counts, and on rank 0 the union's values.

``--golden``: the uneven case behind Lightning-AI/pytorch-lightning#21859: 44 validation samples over the ranks
(6,6,6,6,5,5,5,5 with 8), a tiny model.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
from common import Record, keras, spy_local_logs

import hvd_mlflow

TRAIN = (100, 37)  # samples per rank (rank 0, rank 1): uneven on purpose
VAL = (50, 18)
# training steps per epoch, the same on every rank (Horovod averages gradients each step): batches of uneven sizes,
# into which neither rank's samples divide (Keras 3 weighs an output's loss per batch by its static size, if known)
STEPS = 3
VAL_BATCH = 16


def batch_for(samples: int, steps: int) -> int:
    """The batch size that makes ``samples`` into ``steps`` batches (the last one smaller)."""
    batch = -(-samples // steps)
    assert -(-samples // batch) == steps, (samples, steps)
    return batch


class MaxAbsError(keras.metrics.Metric):
    """A running maximum: its state does NOT add up over ranks (a max, not a sum)."""

    def __init__(self, name: str = "max_err", **kwargs) -> None:
        super().__init__(name=name, **kwargs)
        self.worst = self.add_weight(name="worst", shape=(), initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        import tensorflow as tf

        err = tf.reduce_max(tf.abs(tf.cast(tf.reshape(y_true, [-1]), "float32") - tf.reshape(y_pred, [-1])))
        self.worst.assign(tf.maximum(self.worst, err))

    def result(self):
        return self.worst

    def reset_state(self):
        self.worst.assign(0.0)


class PositiveCount(keras.metrics.Metric):
    """A counter of positive labels: its state adds up, and it says so (keras-team/keras#21054)."""

    hvd_mlflow_additive = True

    def __init__(self, name: str = "positives", **kwargs) -> None:
        super().__init__(name=name, **kwargs)
        self.count = self.add_weight(name="count", shape=(), initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        import tensorflow as tf

        self.count.assign_add(tf.reduce_sum(tf.cast(tf.reshape(y_true, [-1]) > 0.5, "float32")))

    def result(self):
        return self.count

    def reset_state(self):
        self.count.assign(0.0)


def features(rank: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * seed + rank)
    return rng.normal(loc=0.3 * rank, size=(n, 8)).astype("float32")


def binary(x: np.ndarray, rank: int) -> np.ndarray:
    return (x.sum(axis=1) + 0.7 * np.sin(3 * x[:, 0]) > 0.4 * rank).astype("float32")


def classes(x: np.ndarray) -> np.ndarray:
    return (np.floor(np.abs(x[:, 0] * 2 + x[:, 1])) % 4).astype("int64")


def compile_sgd(model, **kwargs):
    model.compile(optimizer=keras.optimizers.SGD(0.0), **kwargs)  # lr 0: the weights never move
    return model


def dense_model(outputs: dict[str, tuple[int, str]]):
    keras.utils.set_random_seed(11)
    inputs = keras.Input(shape=(8,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    heads = {name: keras.layers.Dense(units, activation=act, name=name)(hidden) for name, (units, act) in
             outputs.items()}  # fmt: skip
    return keras.Model(inputs, heads if len(heads) > 1 else next(iter(heads.values())))


# -- scenarios: (build model, make (x, y, sample_weight) for a rank and seed, fit kwargs) ----------------------
def multi_output():
    model = compile_sgd(
        dense_model({"a": (1, "sigmoid"), "b": (1, None)}),
        loss={"a": "binary_crossentropy", "b": "mse"},
        loss_weights={"a": 1.0, "b": 0.5},
        # R2Score last: with Keras 3.3, a metric listed after it on the same output is silently dropped
        metrics={
            "a": ["accuracy", keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision"), MaxAbsError()],
            "b": ["mae", MaxAbsError(), keras.metrics.R2Score(name="r2")],
        },
    )

    def data(rank, n, seed):
        x = features(rank, n, seed)
        return x, {"a": binary(x, rank)[:, None], "b": (x[:, :3].sum(axis=1, keepdims=True) * 0.5)}, None

    return model, data, {}


def classification():
    model = compile_sgd(
        dense_model({"c": (4, "softmax"), "s": (4, "softmax")}),
        loss={"c": "categorical_crossentropy", "s": "sparse_categorical_crossentropy"},
        metrics={
            "c": [
                keras.metrics.F1Score(average="macro", name="f1"),
                keras.metrics.FBetaScore(beta=2.0, average="micro", name="f2"),
                keras.metrics.OneHotMeanIoU(num_classes=4, name="miou"),
                keras.metrics.OneHotIoU(num_classes=4, target_class_ids=[1], name="iou1"),
                keras.metrics.AUC(multi_label=True, name="auc_ml"),
                "categorical_accuracy",
            ],
            "s": [
                keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2"),
                keras.metrics.MeanIoU(num_classes=4, sparse_y_pred=False, name="smiou"),
            ],
        },  # fmt: skip
    )

    def data(rank, n, seed):
        x = features(rank, n, seed)
        labels = classes(x)
        return x, {"c": np.eye(4, dtype="float32")[labels], "s": labels}, None

    return model, data, {}


def weighted():
    model = compile_sgd(dense_model({"o": (1, "sigmoid")}), loss="binary_crossentropy",
                        metrics=["accuracy", keras.metrics.AUC(name="auc")],
                        weighted_metrics=[keras.metrics.BinaryAccuracy(name="w_acc")])  # fmt: skip

    def data(rank, n, seed):
        x = features(rank, n, seed)
        return x, binary(x, rank), (1.0 + np.abs(x[:, 2])).astype("float32")

    return model, data, {}


CLASS_WEIGHT = {0: 1.0, 1: 3.0}


def class_weighted():
    model = compile_sgd(dense_model({"o": (1, "sigmoid")}), loss="binary_crossentropy",
                        metrics=["accuracy", keras.metrics.Recall(name="recall")],
                        weighted_metrics=[keras.metrics.BinaryAccuracy(name="w_acc")])  # fmt: skip

    def data(rank, n, seed):
        x = features(rank, n, seed)
        return x, binary(x, rank), None

    return model, data, {"class_weight": CLASS_WEIGHT}


def schedule():
    model = compile_sgd(dense_model({"o": (1, "sigmoid")}), loss="binary_crossentropy", steps_per_execution=3,
                        metrics=["accuracy", keras.metrics.AUC(name="auc")])  # fmt: skip

    def data(rank, n, seed):
        x = features(rank, n, seed)
        return x, binary(x, rank), None

    # 6 training steps, validation batches of 4: every rank runs at least one whole execution of 3 batches, training
    # and validation alike (Keras 3.3 fails on an epoch shorter than one execution)
    return model, data, {"validation_freq": 2, "validation_split": 0.25, "steps": 6, "validation_batch_size": 4}


def custom():
    model = compile_sgd(dense_model({"o": (1, "sigmoid")}), loss="binary_crossentropy",
                        metrics=["accuracy", MaxAbsError(), PositiveCount()])  # fmt: skip

    def data(rank, n, seed):
        x = features(rank, n, seed)
        return x, binary(x, rank), None

    return model, data, {}


def small_val():
    model = compile_sgd(dense_model({"o": (1, "sigmoid")}), loss="binary_crossentropy",
                        metrics=["accuracy", keras.metrics.Precision(name="precision")])  # fmt: skip

    def data(rank, n, seed):
        x = features(rank, n if seed == 0 or rank == 0 else 5, seed)  # rank 1: 5 validation samples, batch 16
        return x, binary(x, rank), None

    return model, data, {}


SCENARIOS = {
    "multi_output": multi_output,
    "classification": classification,
    "weighted": weighted,
    "class_weighted": class_weighted,
    "schedule": schedule,
    "custom": custom,
    "small_val": small_val,
}


def run_scenario(name: str, record: Record, epochs: int) -> None:
    rank, size = hvd.rank(), hvd.size()
    model, data, fit_kwargs = SCENARIOS[name]()
    split = fit_kwargs.get("validation_split")
    x, y, w = data(rank, TRAIN[rank % 2], seed=0)
    val = None if split else data(rank, VAL[rank % 2], seed=1)
    hvd_mlflow.autolog(extra_tags={"conformance": name})
    own = int(TRAIN[rank % 2] * (1 - split)) if split else TRAIN[rank % 2]  # this rank's training samples
    batch = batch_for(own, fit_kwargs.pop("steps", STEPS))
    fit_kwargs = {"batch_size": batch, "validation_batch_size": VAL_BATCH, **fit_kwargs}
    history = model.fit(x, y, sample_weight=w, epochs=epochs, verbose=0,
                        validation_data=None if val is None else (val[0], val[1], val[2]), **fit_kwargs)  # fmt: skip
    out = {"history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
           "local": record["local"][-1]}  # fmt: skip
    if rank == 0:
        out["union_train"], out["union_val"] = union(model, data, fit_kwargs, size)
    record.setdefault("scenarios", {})[name] = out
    record.save()


def union(model, data, fit_kwargs, size):
    """The same weights evaluated in one process on every rank's samples together: the truth."""
    split = fit_kwargs.get("validation_split")
    parts = [data(r, TRAIN[r % 2], seed=0) for r in range(size)]
    if split:  # Keras' validation_split takes the last fraction of each rank's own arrays
        cut = [int(TRAIN[r % 2] * (1 - split)) for r in range(size)]
        val = [_slice(p, c, None) for p, c in zip(parts, cut, strict=True)]
        parts = [_slice(p, 0, c) for p, c in zip(parts, cut, strict=True)]
    else:
        val = [data(r, VAL[r % 2], seed=1) for r in range(size)]
    # class_weight weighs the training loss only; validation_data's own sample weights are in ``val``
    return _evaluate(model, parts, fit_kwargs), _evaluate(model, val, {})


def _slice(part, start, stop):
    x, y, w = part
    y = {k: v[start:stop] for k, v in y.items()} if isinstance(y, dict) else y[start:stop]
    return x[start:stop], y, None if w is None else w[start:stop]


def _evaluate(model, parts, fit_kwargs):
    x = np.concatenate([p[0] for p in parts])
    if isinstance(parts[0][1], dict):
        y = {k: np.concatenate([p[1][k] for p in parts]) for k in parts[0][1]}
    else:
        y = np.concatenate([p[1] for p in parts])
    w = None if parts[0][2] is None else np.concatenate([p[2] for p in parts])
    if "class_weight" in fit_kwargs:  # what fit does with class_weight: a sample weight per label
        w = np.array([fit_kwargs["class_weight"][int(label)] for label in np.ravel(y)], dtype="float32")
    result = model.evaluate(x, y, sample_weight=w, batch_size=4, verbose=0, return_dict=True)  # >= 3 batches
    return {k: float(np.asarray(v)) for k, v in result.items()}


def golden(record: Record, epochs: int) -> None:
    """44 validation samples over the ranks, as evenly as they go (6,6,6,6,5,5,5,5 with 8)."""
    rank, size = hvd.rank(), hvd.size()
    counts = [44 // size + (1 if r < 44 % size else 0) for r in range(size)]
    model = compile_sgd(
        dense_model({"o": (1, "sigmoid")}),
        loss="binary_crossentropy",
        metrics=["accuracy", keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision")],
    )

    def part(r, n, seed):
        x = features(r, n, seed)
        return x, binary(x, r), None

    hvd_mlflow.autolog(extra_tags={"conformance": "golden"})
    history = model.fit(*part(rank, 32, 0)[:2], batch_size=16, epochs=epochs, verbose=0,
                        validation_data=part(rank, counts[rank], 1)[:2])  # fmt: skip
    out = {"history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
           "local": record["local"][-1], "val_counts": counts}  # fmt: skip
    if rank == 0:
        out["union_val"] = _evaluate(model, [part(r, counts[r], 1) for r in range(size)], {})
    record.setdefault("scenarios", {})["golden"] = out
    record.save()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--golden", action="store_true")
    args = parser.parse_args()
    hvd.init()
    logging.basicConfig(level=logging.WARNING, format=f"[rank {hvd.rank()}] %(name)s %(levelname)s: %(message)s")
    record = Record(args.out, hvd.rank())
    spy_local_logs(record)
    if args.golden:
        golden(record, args.epochs)
    else:
        for name in args.scenarios.split(","):
            run_scenario(name, record, args.epochs)
    record["finished"] = True
    record.save()


if __name__ == "__main__":
    main()
