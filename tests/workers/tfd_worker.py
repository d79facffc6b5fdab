"""One tf.distribute worker (MultiWorkerMirroredStrategy, tf_keras), as AzureML's ``distribution: type: tensorflow``
jobs run one: ``TF_CONFIG`` says where it stands; ``hvd_mlflow.autolog()`` is called after the strategy is made.

    TF_CONFIG=... python tfd_worker.py --out DIR [--scenarios a,b] [--epochs N] [--autolog-options JSON]

Each scenario is one ``fit`` on this worker's own data (uneven: worker 0 has twice worker 1's samples in every
batch, the same number of steps), a distributed dataset per worker (``distribute_datasets_from_function``).
Scenarios with ``lr0`` train with a learning rate of 0, so the weights never move and every value has an
independent truth: after ``fit`` this process evaluates the same weights with plain Keras, outside the strategy (a
model of its own, no collective), on its own shard (each worker) and on the union of every worker's shard (the
chief): the values hvd-mlflow must log, computed without it. Keras' own epoch logs (before any callback) are kept
too, to show where Keras' value is wrong. Worker ``R`` (tf.distribute's rank: the chief is 0) writes
``rank<R>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
from common import Record, SeenLogs, keras, spy_local_logs

STEPS, VAL_STEPS = 6, 3
BATCH = (16, 8)  # each worker's batch (worker 0, worker 1): uneven on purpose, the same number of steps
VAL_BATCH = (12, 5)


class MaxAbsError(keras.metrics.Metric):
    """A running maximum: its state does NOT add up over workers (Keras sums it: the sum of the maxima)."""

    def __init__(self, name: str = "max_err", **kwargs) -> None:
        super().__init__(name=name, **kwargs)
        self.worst = self.add_weight(name="worst", shape=(), initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        err = tf.reduce_max(tf.abs(tf.cast(tf.reshape(y_true, [-1]), "float32") - tf.reshape(y_pred, [-1])))
        self.worst.assign(tf.maximum(self.worst, err))

    def result(self):
        return self.worst

    def reset_state(self):
        self.worst.assign(0.0)


class PositiveCount(keras.metrics.Metric):
    """A counter of positive labels whose state adds up, and says so. ``aggregation``: how Keras reads it over
    replicas: ``mean`` (a user's choice, as in tensorflow#64471) makes Keras' own value the mean of the workers'
    counts, half the count over two workers; the copies still add up (hvd-mlflow adds them)."""

    hvd_mlflow_additive = True

    def __init__(self, name: str = "positives", aggregation: str = "sum", **kwargs) -> None:
        super().__init__(name=name, **kwargs)
        how = tf.VariableAggregation.MEAN if aggregation == "mean" else tf.VariableAggregation.SUM
        self.count = self.add_weight(name="count", shape=(), initializer="zeros", aggregation=how)

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.count.assign_add(tf.reduce_sum(tf.cast(tf.reshape(y_true, [-1]) > 0.5, "float32")))

    def result(self):
        return tf.identity(self.count)

    def reset_state(self):
        self.count.assign(0.0)


def features(rank: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * seed + rank)
    return rng.normal(loc=0.3 * rank, size=(n, 8)).astype("float32")


def binary(x: np.ndarray, rank: int) -> np.ndarray:
    return (x.sum(axis=1) + 0.7 * np.sin(3 * x[:, 0]) > 0.4 * rank).astype("float32")[:, None]


def dense_model(outputs: dict[str, tuple[int, str | None]]):
    keras.utils.set_random_seed(11)
    inputs = keras.Input(shape=(8,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    heads = {name: keras.layers.Dense(units, activation=act, name=name)(hidden) for name, (units, act) in
             outputs.items()}  # fmt: skip
    return keras.Model(inputs, heads if len(heads) > 1 else next(iter(heads.values())))


# -- scenarios: (build and compile the model, make (x, y, sample_weight) of a worker, fit kwargs) ---------------
def classification(lr: float):
    model = dense_model({"o": (1, "sigmoid")})
    model.compile(optimizer=keras.optimizers.SGD(lr), loss="binary_crossentropy",
                  metrics=["accuracy", keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision"),
                           keras.metrics.Recall(name="recall")])  # fmt: skip
    return model, lambda rank, n, seed: (features(rank, n, seed), binary(features(rank, n, seed), rank), None), {}


def multi_output(lr: float):
    model = dense_model({"a": (1, "sigmoid"), "b": (1, None)})
    model.compile(optimizer=keras.optimizers.SGD(lr), loss={"a": "binary_crossentropy", "b": "mse"},
                  loss_weights={"a": 1.0, "b": 0.5},
                  metrics={"a": ["accuracy", keras.metrics.AUC(name="auc")], "b": ["mae", MaxAbsError()]})  # fmt: skip

    def data(rank, n, seed):
        x = features(rank, n, seed)
        return x, {"a": binary(x, rank), "b": x[:, :3].sum(axis=1, keepdims=True) * 0.5}, None

    return model, data, {}


def weighted(lr: float):
    model = dense_model({"o": (1, "sigmoid")})
    model.compile(optimizer=keras.optimizers.SGD(lr), loss="binary_crossentropy",
                  metrics=["accuracy", keras.metrics.AUC(name="auc")],
                  weighted_metrics=[keras.metrics.BinaryAccuracy(name="w_acc")])  # fmt: skip

    def data(rank, n, seed):
        x = features(rank, n, seed)
        return x, binary(x, rank), (1.0 + np.abs(x[:, 2])).astype("float32")

    return model, data, {}


def custom(lr: float):
    model = dense_model({"o": (1, "sigmoid")})
    model.compile(optimizer=keras.optimizers.SGD(lr), loss="binary_crossentropy",
                  metrics=["accuracy", MaxAbsError(), PositiveCount(),
                           PositiveCount(name="positives_mean_read", aggregation="mean")])  # fmt: skip
    return model, lambda rank, n, seed: (features(rank, n, seed), binary(features(rank, n, seed), rank), None), {}


SCENARIOS = {"classification": classification, "multi_output": multi_output, "weighted": weighted, "custom": custom}


class Interrupted(Exception):
    """The job is stopped (as a preempted node stops it), on every worker at the same epoch end."""


class Interrupt(keras.callbacks.Callback):
    """Stops ``fit`` after epoch ``at`` was logged (hvd-mlflow's callback comes first), before a later callback
    (BackupAndRestore) saves it: the restarted job trains that epoch again."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.at:
            raise Interrupted(f"stopped after epoch {epoch}")


def dataset(data, rank: int, seed: int, batch: int, steps: int) -> tf.data.Dataset:
    """This worker's samples: exactly ``steps`` batches of ``batch``, repeated, so every epoch sees each once."""
    x, y, w = data(rank, batch * steps, seed)
    parts = (x, y) if w is None else (x, y, w)
    return tf.data.Dataset.from_tensor_slices(parts).batch(batch, drop_remainder=True).repeat()


def run_scenario(name: str, strategy, rank: int, record: Record, args: argparse.Namespace) -> None:
    import hvd_mlflow

    lr = 0.0 if args.lr0 else 0.05
    if args.outside_scope:  # the user forgot strategy.scope(): each worker would train alone
        model, data, fit_kwargs = SCENARIOS[name](lr)
    else:
        with strategy.scope():
            model, data, fit_kwargs = SCENARIOS[name](lr)
    train = strategy.distribute_datasets_from_function(lambda ctx: dataset(data, rank, 0, BATCH[rank], STEPS))
    val = strategy.distribute_datasets_from_function(lambda ctx: dataset(data, rank, 1, VAL_BATCH[rank], VAL_STEPS))
    if args.outside_scope:  # and, as such a script does, plain datasets
        train, val = dataset(data, rank, 0, BATCH[rank], STEPS), dataset(data, rank, 1, VAL_BATCH[rank], VAL_STEPS)
    if not os.environ.get("TFD_NO_HVD"):
        hvd_mlflow.autolog(extra_tags={"scenario": name}, **json.loads(args.autolog_options))
    seen: dict = {}
    out: dict = {}
    callbacks = [SeenLogs(seen)]
    if args.tensorboard:  # as users add it: on every worker, into one folder
        callbacks.append(keras.callbacks.TensorBoard(log_dir=args.tensorboard))
    if args.user_mlflow:  # the user's own MLflow calls, on every worker alike (AzureML's examples make them)
        import mlflow

        mlflow.log_param("user_param", "from every worker")
        mlflow.log_metric("user_metric", 10.0 + rank)
    if args.interrupt_after_epoch >= 0:  # a job stopped after this epoch was logged, before its backup was written
        callbacks.append(Interrupt(args.interrupt_after_epoch))
    if args.backup:  # keras.callbacks.BackupAndRestore: a restarted job goes on from the last backed-up epoch
        callbacks.append(keras.callbacks.BackupAndRestore(args.backup))
    started = time.monotonic()
    _TIMES.clear()
    try:
        history = model.fit(train, epochs=args.epochs, steps_per_epoch=STEPS, validation_data=val,
                            validation_steps=VAL_STEPS, verbose=0, callbacks=callbacks, **fit_kwargs)  # fmt: skip
    except Interrupted:
        out["seen"] = seen.get("seen", [])
        record.setdefault("scenarios", {})[name] = out
        record.save()
        return
    except Exception as error:
        record["raised"] = f"{type(error).__name__}: {error}"
        record.save()
        raise
    if args.transfer_recipe:  # keras-io's transfer-learning guide: compile again with a low rate, fit again from 0
        with strategy.scope():
            model.compile(optimizer=keras.optimizers.SGD(0.005), loss="binary_crossentropy", metrics=["accuracy"])
        more = model.fit(train, epochs=args.transfer_recipe, steps_per_epoch=STEPS, validation_data=val,
                         validation_steps=VAL_STEPS, verbose=0, callbacks=[SeenLogs(seen)])  # fmt: skip
        out["history_second_fit"] = {k: [float(v) for v in vs] for k, vs in more.history.items()}
    out["fit_returned_at"] = time.time()
    out.update(_TIMES)
    callback = _hvd_callback()
    if callback is not None:
        out["run_id"] = callback.run_id
    if args.save:  # every worker saves (the strategy's collectives); the chief's is the model, the others' temporary
        where = Path(args.save) / ("model" if rank == 0 else f"workertemp_{rank}/model")
        model.save(str(where))
        out["saved"] = (where / "saved_model.pb").is_file()
    out.update({"history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
           "keras_own": record["local"][-1], "seen": seen.get("seen", []), "fit_s": time.monotonic() - started,
           "samples": {"train": BATCH[rank] * STEPS, "val": VAL_BATCH[rank] * VAL_STEPS}})  # fmt: skip
    out["keras_batches"] = record["batches"][-1]
    if args.lr0:  # the truth, with plain Keras outside the strategy: no collective, no hvd-mlflow
        out["own_train"], out["own_val"], out["own_batches"] = truth(name, model, [rank])
        if rank == 0:
            out["union_train"], out["union_val"], out["union_batches"] = truth(name, model, list(range(args.workers)))
    record.setdefault("scenarios", {})[name] = out
    record.save()


def truth(name: str, trained, ranks: list[int]) -> tuple[dict, dict, list[dict]]:
    """``trained``'s weights evaluated by a model of the default strategy on the shards of ``ranks`` together: the
    training and validation shards, and the first ``b + 1`` training batches of each, for every batch ``b`` (what
    Keras reports at batch ``b``: the running value since the epoch began)."""
    model, data, _ = SCENARIOS[name](0.0)  # after fit: outside the strategy's scope, a plain model
    model.set_weights(trained.get_weights())
    train = [data(r, BATCH[r] * STEPS, 0) for r in ranks]
    val = [data(r, VAL_BATCH[r] * VAL_STEPS, 1) for r in ranks]
    prefixes = [_evaluate(model, [_head(part, BATCH[r] * (b + 1)) for r, part in zip(ranks, train, strict=True)])
                for b in range(STEPS)]  # fmt: skip
    return _evaluate(model, train), _evaluate(model, val), prefixes


def _head(part, n: int):
    x, y, w = part
    return x[:n], ({k: v[:n] for k, v in y.items()} if isinstance(y, dict) else y[:n]), None if w is None else w[:n]


def _evaluate(model, parts) -> dict:
    x = np.concatenate([p[0] for p in parts])
    if isinstance(parts[0][1], dict):
        y = {k: np.concatenate([p[1][k] for p in parts]) for k in parts[0][1]}
    else:
        y = np.concatenate([p[1] for p in parts])
    w = None if parts[0][2] is None else np.concatenate([p[2] for p in parts])
    result = model.evaluate(x, y, sample_weight=w, batch_size=7, verbose=0, return_dict=True)
    return {k: float(np.asarray(v)) for k, v in result.items()}


_CALLBACKS: list = []
_TIMES: dict = {}  # this fit's: when Keras' train-end callbacks began, how long hvd-mlflow's end of fit took


def _hvd_callback():
    """The HorovodMlflowCallback autolog added to the last fit (seen by the spy on Keras' callback list)."""
    return next((cb for cb in reversed(_CALLBACKS) if type(cb).__name__ == "HorovodMlflowCallback"), None)


def spy_batch_logs(record: Record) -> None:
    """Keras' own batch logs on this worker (before any callback), one dict per fit: batch index -> logs."""
    callback_list = keras.callbacks.CallbackList
    original_begin, original_end = callback_list.on_train_begin, callback_list.on_train_batch_end
    original_train_end = callback_list.on_train_end

    def on_train_begin(self, logs=None):
        record.setdefault("batches", []).append({})
        _CALLBACKS[:] = list(self.callbacks)
        return original_begin(self, logs)

    def on_train_batch_end(self, batch, logs=None):
        record["batches"][-1][str(batch)] = {k: float(np.asarray(v)) for k, v in (logs or {}).items()}
        return original_end(self, batch, logs)

    def on_train_end(self, logs=None):  # Keras' last epoch is over on this worker (wall clock)
        _TIMES["train_end_began_at"] = time.time()
        return original_train_end(self, logs)

    callback_list.on_train_begin = on_train_begin
    callback_list.on_train_batch_end = on_train_batch_end
    callback_list.on_train_end = on_train_end


def spy_end_fit() -> None:
    """How long hvd-mlflow's own end of the fit took on this worker (the rest of ``fit``'s end is Keras' and TF's)."""
    import hvd_mlflow

    end_fit = hvd_mlflow.HorovodMlflowCallback._end_fit

    def recording_end_fit(self, *args, **kwargs):
        began, first = time.perf_counter(), not self._finished
        try:
            return end_fit(self, *args, **kwargs)
        finally:
            if first:
                _TIMES["end_fit_s"] = time.perf_counter() - began

    hvd_mlflow.HorovodMlflowCallback._end_fit = recording_end_fit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr0", action="store_true", help="a learning rate of 0: every value has a truth")
    parser.add_argument("--autolog-options", default="{}", help="hvd_mlflow.autolog()'s options, as JSON")
    parser.add_argument("--tensorboard", default="", help="Keras' TensorBoard callback on every worker, this folder")
    parser.add_argument("--user-mlflow", action="store_true", help="mlflow.log_param/log_metric on every worker")
    parser.add_argument("--outside-scope", action="store_true", help="the model built outside strategy.scope()")
    parser.add_argument("--save", default="", help="after fit, model.save on every worker as Azure's example does")
    parser.add_argument("--transfer-recipe", type=int, default=0, help="then compile again and fit this many epochs")
    parser.add_argument("--backup", default="", help="keras.callbacks.BackupAndRestore into this folder")
    parser.add_argument("--interrupt-after-epoch", type=int, default=-1, help="fit stops on every worker after it")
    args = parser.parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    cluster = resolver.cluster_spec().as_dict()  # tf.distribute's own order: the chief first, then the workers
    chiefs = len(cluster.get("chief", []))
    rank = resolver.task_id if resolver.task_type == "chief" else resolver.task_id + chiefs
    args.workers = chiefs + len(cluster.get("worker", []))
    logging.basicConfig(level=logging.WARNING, format=f"[worker {rank}] %(name)s %(levelname)s: %(message)s")
    record = Record(args.out, rank)
    record.update(pid=os.getpid(), task=[resolver.task_type, resolver.task_id], tf=tf.__version__)
    spy_local_logs(record)
    spy_batch_logs(record)
    spy_end_fit()
    for name in args.scenarios.split(","):
        run_scenario(name, strategy, rank, record, args)
    record["finished"] = True
    record.save()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
