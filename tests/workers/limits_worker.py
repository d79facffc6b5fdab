"""Trainings that meet AzureML's per-run limits, for tests/azureml/test_limits.py: one named scenario per run.

    horovodrun -np 2 -H localhost:2 --gloo python limits_worker.py --out DIR SCENARIO [options]

* ``many-metrics``: 14 compiled metrics (15 keys with the loss, 30 with ``val_``), ``rank_spread`` on 4 keys,
  ``log_every_n_steps=2`` (15 ``batch/`` keys) and one ``mlflow.log_metric`` by the user on rank 0: over 50 names.
* ``plain``: the small model, options from the ``HVD_MLFLOW_*`` environment, ``--epoch-sleep`` seconds per epoch,
  ``--params N`` extra params ``p_000.. = --param-value``.

Each rank writes ``rank<R>.json``: Keras' own epoch logs (before any callback), the History (global values) and,
on rank 0, how long each epoch end took in the callbacks.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import horovod.tensorflow as hvd
from common import Record, data, keras, keras_module, small_model, spy_local_logs

import hvd_mlflow

SPREAD = ["loss", "accuracy", "auc", "precision"]


def many_metrics_model():
    m = keras.metrics
    metrics = [
        "accuracy", m.AUC(name="auc"), m.AUC(curve="PR", name="pr_auc"), m.Precision(name="precision"),
        m.Recall(name="recall"), m.TruePositives(name="tp"), m.TrueNegatives(name="tn"),
        m.FalsePositives(name="fp"), m.FalseNegatives(name="fn"), m.MeanSquaredError(name="mse"),
        m.MeanAbsoluteError(name="mae"), m.BinaryCrossentropy(name="bce"), m.RootMeanSquaredError(name="rmse"),
        m.LogCoshError(name="logcosh"),
    ]  # fmt: skip
    keras.utils.set_random_seed(7)
    model = keras.Sequential(
        [keras.Input(shape=(8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1, "sigmoid")]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy", metrics=metrics)
    return model


def timed_epoch_ends(record: Record) -> None:
    """How long every callback together took at each epoch end on this rank, and how much of it was the wait in
    hvd-mlflow's collective for the other ranks (on 2 busy cores the ranks drift apart by seconds at times)."""
    from hvd_mlflow.every_rank import aggregate

    callback_list = keras_module.callbacks.CallbackList
    original, reduce = callback_list.on_epoch_end, aggregate.Reducer.reduce_all
    waited = {"s": 0.0}

    def timed_reduce(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return reduce(self, *args, **kwargs)
        finally:
            waited["s"] += time.perf_counter() - start

    def on_epoch_end(self, epoch, logs=None):
        start, waited["s"] = time.perf_counter(), 0.0
        result = original(self, epoch, logs)
        record.setdefault("epoch_end_s", []).append(time.perf_counter() - start)
        record.setdefault("collective_s", []).append(waited["s"])
        return result

    aggregate.Reducer.reduce_all = timed_reduce
    callback_list.on_epoch_end = on_epoch_end


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["many-metrics", "plain"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--epoch-sleep", type=float, default=0.0)
    parser.add_argument("--params", type=int, default=0)
    parser.add_argument("--param-value", default="1")
    parser.add_argument("--user-scores", action="store_true", help="rank 0: user_score each epoch, test_* after")
    args = parser.parse_args()
    hvd.init()
    rank = hvd.rank()
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(name)s %(levelname)s: %(message)s")
    record = Record(args.out, rank)
    options: dict = {}
    if args.params:
        options["extra_params"] = {f"p_{i:03d}": args.param_value for i in range(args.params)}
    if args.scenario == "many-metrics":
        options.update(rank_spread=SPREAD, log_every_n_steps=2)
    hvd_mlflow.autolog(**options)
    spy_local_logs(record)
    timed_epoch_ends(record)
    if args.scenario == "many-metrics":
        model = many_metrics_model()
        if rank == 0:
            import mlflow

            mlflow.log_metric("dataset_size", 96.0)  # what many scripts log themselves, before training
    else:
        model = small_model()
    x, y = data(rank, 96)
    xv, yv = data(rank, 48, seed=10)
    if args.scenario == "many-metrics":  # some Keras 3 metrics want targets shaped like the output: (n, 1)
        y, yv = y[:, None], yv[:, None]

    class Sleep(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            time.sleep(args.epoch_sleep)  # stands for real compute

    class UserScore(keras.callbacks.Callback):  # the user's own metric, logged after hvd-mlflow's epoch end
        def on_epoch_end(self, epoch, logs=None):
            if rank == 0:
                import mlflow

                mlflow.log_metric("user_score", 100.0 + epoch, step=epoch)

    callbacks = [Sleep(), *([UserScore()] if args.user_scores else [])]
    history = model.fit(x, y, batch_size=16, epochs=args.epochs, validation_data=(xv, yv), verbose=0,
                        callbacks=callbacks)  # fmt: skip
    if args.user_scores and rank == 0:  # a test score, after fit, as many scripts end
        import mlflow

        mlflow.log_metric("test_score", 0.75)
        mlflow.log_metrics({"test_loss": 0.5, "test_auc": 0.8})
    record["history"] = {k: [float(v) for v in vs] for k, vs in history.history.items()}
    record["finished"] = True
    record.save()


if __name__ == "__main__":
    main()
