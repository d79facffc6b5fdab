"""A real distributed Keras training for the tests: each rank fits on its own data with hvd-mlflow.

Each rank writes ``rank<R>.json`` into ``--out`` (again after every epoch, so a killed rank leaves what it
did) with what the tests compare against:
* ``local``: Keras' own epoch logs as Keras computed them on this rank, recorded by a spy on Keras'
  ``CallbackList.on_epoch_end`` before any callback (hvd-mlflow's included) runs: the independent truth;
* ``history``: what ``model.history`` (the last callback) recorded: must be the global values;
* ``run_id``: the run id hvd-mlflow's callback holds on this rank (after its last epoch end, or at train end);
  ``run_id_at_train_begin``: the one it holds once every callback's ``on_train_begin`` has run;
* ``train_begin_at`` / ``fit_returned_at`` (wall clock, before the model is built / when the first ``fit`` returned),
  and ``exit<R>.json``'s ``at``: when this process's last exit hook ran;
* ``epoch_end_s`` / ``train_begin_s``: how long the callbacks took at those points, ``train_end_s`` from Keras'
  train-end callbacks until ``fit`` returned (autolog ends the fit after them) (on rank 0 that is the stall
  hvd-mlflow adds to the training).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import importlib.util
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import weakref
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import hvd_mlflow

keras = tf.keras
flavour = keras.Model.__module__.split(".", 1)[0]
# Each rank trains on its own here (no gradient averaging: the tests compare with each rank's own Keras values),
# so the ranks' weights differ by design: the divergence check (on by default) is for real trainings; it has
# its own tests (tests/multirank/test_divergence.py).
os.environ.setdefault("HVD_MLFLOW_CHECK_DIVERGENCE", "0")
keras_module = importlib.import_module(flavour)
record: dict = {
    "local": [],
    "flavour": flavour,
    "keras_major": int(keras_module.__version__.split(".")[0]),
    "epoch_end_s": [],
}
ODD_NAMES = ["acc@5", "f(1)", "val loss", "précision", "top 1/err"]
UNEVEN_SIZES = (100, 37, 64, 23)  # --uneven: each rank's training samples (its validation shard: half)


def save(out: Path) -> None:
    (out / f"rank{hvd.rank()}.json").write_text(json.dumps(record))


def spy(args: argparse.Namespace) -> None:
    """Record Keras' own local logs and the callbacks' time, around Keras' callback dispatch."""
    callback_list = keras_module.callbacks.CallbackList
    originals = {
        name: getattr(callback_list, name)
        for name in ("on_epoch_begin", "on_epoch_end", "on_train_begin", "on_train_end")
    }
    record["epoch_seconds"] = []

    def on_epoch_begin(self, epoch, logs=None):
        record["_epoch_began"] = time.perf_counter()
        return originals["on_epoch_begin"](self, epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        record["local"].append({k: float(np.asarray(v)) for k, v in (logs or {}).items()})
        start = time.perf_counter()
        result = originals["on_epoch_end"](self, epoch, logs)
        record["epoch_end_s"].append(time.perf_counter() - start)
        # the epoch as the job lives it: until every rank is through the epoch end's collective
        record["epoch_seconds"].append(time.perf_counter() - record["_epoch_began"])
        for cb in self.callbacks:
            if isinstance(cb, hvd_mlflow.HorovodMlflowCallback):
                record["run_id"] = cb.run_id
        save(args.out)
        if args.kill_rank0_at_epoch == epoch and hvd.rank() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    def timed(name):
        def hook(self, logs=None):
            start = time.perf_counter()
            record[f"_{name[3:]}_began"] = start
            result = originals[name](self, logs)
            record[f"{name[3:]}_s"] = time.perf_counter() - start
            if name == "on_train_begin":  # what a user's script reads right after: its checkpoint paths, say
                record["run_id_at_train_begin"] = next((cb.run_id for cb in self.callbacks if isinstance(
                    cb, hvd_mlflow.HorovodMlflowCallback)), None)  # fmt: skip
            return result

        return hook

    end_fit = hvd_mlflow.HorovodMlflowCallback._end_fit

    def recording_end_fit(self, *args, **kwargs):  # a run opened after the last epoch's collective: known at the end
        began, first = time.perf_counter(), not self._finished
        result = end_fit(self, *args, **kwargs)
        if first:  # hvd-mlflow's own end of the fit (train_end_s also holds Keras' and the other callbacks')
            record["end_fit_s"] = time.perf_counter() - began
            if "_train_end_began" in record:  # how long after Keras' train-end callbacks began it began
                record["end_fit_began_s"] = began - record["_train_end_began"]
        if self.run_id:
            record["run_id"] = self.run_id
        return result

    hvd_mlflow.HorovodMlflowCallback._end_fit = recording_end_fit

    if args.log_every_n_steps:
        original_batch_end = callback_list.on_train_batch_end

        def on_train_batch_end(self, batch, logs=None):
            iterations = int(np.asarray(self.model.optimizer.iterations))
            local = {k: float(np.asarray(v)) for k, v in (logs or {}).items()}
            record.setdefault("local_batches", []).append({"iterations": iterations, **local})
            return original_batch_end(self, batch, logs)

        callback_list.on_train_batch_end = on_train_batch_end
    callback_list.on_epoch_end = on_epoch_end
    callback_list.on_epoch_begin = on_epoch_begin
    callback_list.on_train_begin = timed("on_train_begin")
    callback_list.on_train_end = timed("on_train_end")


def audit_connections() -> None:
    """Record every address this process connects to or looks up (Python sockets: MLflow, requests)."""
    record["connects"], record["lookups"] = [], []

    def hook(event, args):
        if event == "socket.connect" and isinstance(args[1], tuple):
            record["connects"].append([str(args[1][0]), int(args[1][1])])
        elif event == "socket.getaddrinfo":
            record["lookups"].append(str(args[0]))

    sys.addaudithook(hook)


class UserLogging(keras.callbacks.Callback):
    """What many user scripts do on every rank: their own mlflow.log_metric each epoch."""

    def on_epoch_end(self, epoch, logs=None):
        import mlflow

        mlflow.log_metric("user_metric", float(hvd.rank() * 100 + epoch), step=epoch)


def data(rank: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rank-dependent data, so every rank's local values differ (``seed`` 10: the validation shard)."""
    rng = np.random.default_rng(100 + rank + seed)
    x = rng.normal(loc=0.4 * rank, size=(n, 8)).astype("float32")
    y = (x.sum(axis=1) + rng.normal(size=n) > 0.5 * rank).astype("float32")
    return x, y


class Extra(keras.callbacks.Callback):
    """Puts more entries into the logs before hvd-mlflow's callback sees them (placed before it)."""

    def __init__(self, count: int, odd_names: bool, collision: bool, epoch_sleep: float) -> None:
        super().__init__()
        self.count, self.odd_names, self.collision, self.epoch_sleep = (
            count,
            odd_names,
            collision,
            epoch_sleep,
        )

    def on_epoch_begin(self, epoch, logs=None):
        time.sleep(self.epoch_sleep)  # stands for real compute: gives faults time to happen mid-training

    def on_epoch_end(self, epoch, logs=None):
        rank = hvd.rank()
        for i in range(self.count):
            logs[f"extra/m{i:04d}"] = float(i + rank + epoch * 0.5)
        if self.odd_names:
            for j, name in enumerate(ODD_NAMES):
                logs[name] = float(j * 10 + rank + epoch)
        if self.collision:
            logs["a@b"], logs["a(b"] = 1.0, 2.0


class Boom(keras.callbacks.Callback):
    """Raises out of fit (placed after hvd-mlflow's callback): at the first batch, or at the end of epoch 1."""

    def __init__(self, where: str, out: Path) -> None:
        super().__init__()
        self.where, self.out = where, out

    def _raise(self) -> None:
        record["raised_at"] = time.time()
        save(self.out)
        raise RuntimeError(f"boom at {self.where}")

    def on_train_batch_end(self, batch, logs=None):
        if self.where == "first-batch":
            self._raise()

    def on_epoch_end(self, epoch, logs=None):
        if self.where == "epoch-1-end" and epoch == 1:
            self._raise()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--explicit-callback", action="store_true", help="pass the callback, no autolog")
    parser.add_argument("--mismatch", action="store_true", help="rank 1 compiles one more metric")
    parser.add_argument("--extra-metrics", type=int, default=0)
    parser.add_argument("--odd-names", action="store_true")
    parser.add_argument("--collision", action="store_true")
    parser.add_argument("--params", type=int, default=0, help="extra params to log")
    parser.add_argument("--epoch-sleep", type=float, default=0.0)
    parser.add_argument("--kill-rank0-at-epoch", type=int, default=-1)
    parser.add_argument("--audit", action="store_true", help="record every socket connect and lookup")
    parser.add_argument("--stray-writers", action="store_true", help="mlflow.log_metric + mlflow autolog on all ranks")
    parser.add_argument("--no-validation", action="store_true")
    parser.add_argument("--uneven", action="store_true", help="ranks 0-3: UNEVEN_SIZES samples; AUC etc.; lr 0")
    parser.add_argument("--reduction", default=None)
    parser.add_argument("--early-stopping", action="store_true", help="EarlyStopping(val_loss), noisy shards")
    parser.add_argument("--lr-schedule", action="store_true", help="learning rate 0.1 * 0.9 ** step")
    parser.add_argument("--log-every-n-steps", type=int, default=0)
    parser.add_argument("--rank-spread", default="", help="comma-separated keys")
    parser.add_argument("--initial-epoch", type=int, default=0)
    parser.add_argument("--then-fit-to", type=int, default=0, help="a second fit, from --epochs to this epoch")
    parser.add_argument("--transfer-recipe", type=int, default=0,
                        help="Keras' transfer-learning guide: the first layer frozen, then unfrozen, compiled again "
                        "with a low learning rate and fitted this many epochs, without initial_epoch")  # fmt: skip
    parser.add_argument("--probe", action="store_true", help="record the final model's predictions on 4 inputs")
    parser.add_argument("--attempt", default="", help="logged as the extra param 'attempt'")
    parser.add_argument("--tensorboard", default="", help="Keras' TensorBoard callback on every rank, into this folder")
    parser.add_argument("--tensorboard-update-freq", default="epoch", help="the TensorBoard callback's update_freq")
    parser.add_argument("--no-log-tensorboard", action="store_true", help="autolog(log_tensorboard=False)")
    parser.add_argument("--tensorboard-profile-batch", default="0", help="the TensorBoard callback's profile_batch")
    parser.add_argument("--raise-at", choices=["first-batch", "epoch-1-end"], help="a callback raises out of fit")
    parser.add_argument("--catch-and-collect", action="store_true",
                        help="with --raise-at: catch the error, drop the callbacks (gc), exit 0")  # fmt: skip
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    parser.add_argument("--warmup-recipe", type=Path, help="a file defining warmup(initial_lr, warmup_epochs)")
    parser.add_argument("--horovod-warmup", action="store_true", help="Horovod's LearningRateWarmupCallback")
    parser.add_argument("--no-momentum-correction", action="store_true", help="its momentum_correction=False")
    parser.add_argument("--warmup-lr", type=float, default=0.1, help="the warm-up's initial_lr: its rate at the end")
    parser.add_argument("--warmup-epochs", type=int, default=3)
    return parser.parse_args()


def hvd_mlflow_options(args: argparse.Namespace) -> dict:
    """The options every rank gives hvd-mlflow (to autolog or the callback)."""
    extra_params = {f"hp_{i:03d}": i for i in range(args.params)}
    if args.attempt:
        extra_params["attempt"] = args.attempt
    options: dict = {"extra_params": extra_params} if extra_params else {}
    if args.reduction:
        options["reduction"] = args.reduction
    if args.log_every_n_steps:
        options["log_every_n_steps"] = args.log_every_n_steps
    if args.rank_spread:
        options["rank_spread"] = args.rank_spread.split(",")
    if args.no_log_tensorboard:
        options["log_tensorboard"] = False
    return options


def extra_logs(args: argparse.Namespace) -> bool:
    """Scenarios where entries are added to the logs before hvd-mlflow's callback: the callback is passed."""
    return bool(args.extra_metrics or args.odd_names or args.collision or args.epoch_sleep)


def compiled_model(args: argparse.Namespace, rank: int):
    metrics = ["accuracy"] + (["mae"] if args.mismatch and rank == 1 else [])
    if args.uneven:
        metrics += [keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision"),
                    keras.metrics.Recall(name="recall")]  # fmt: skip
    model = keras.Sequential(
        [keras.Input(shape=(8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1, "sigmoid")]
    )
    learning_rate = 0.0 if args.uneven else 0.05  # uneven: weights never move, so a union evaluation is the truth
    if args.early_stopping:
        learning_rate = 0.3  # large steps: a noisy val_loss that stops early, at a different epoch on each rank
    if args.lr_schedule:
        learning_rate = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.9)
    optimizer = keras.optimizers.Adam if args.optimizer == "adam" else keras.optimizers.SGD
    model.compile(optimizer=optimizer(learning_rate), loss="binary_crossentropy", metrics=metrics)
    return model


def fit_callbacks(args: argparse.Namespace, model, options: dict) -> list:
    callbacks = []
    if extra_logs(args):
        callbacks.append(Extra(args.extra_metrics, args.odd_names, args.collision, args.epoch_sleep))
    if args.explicit_callback or extra_logs(args):
        callbacks.append(hvd_mlflow.HorovodMlflowCallback(model=model, **options))
    if args.raise_at:
        callbacks.append(Boom(args.raise_at, args.out))
    if args.stray_writers:
        callbacks.append(UserLogging())
    if args.early_stopping:
        callbacks.append(keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=1e-3))
    if args.warmup_recipe:  # the migration guide's code, loaded from the file the test wrote it to
        spec = importlib.util.spec_from_file_location("warmup_recipe", args.warmup_recipe)
        recipe = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(recipe)
        callbacks.append(recipe.warmup(initial_lr=args.warmup_lr, warmup_epochs=args.warmup_epochs))
    if args.horovod_warmup:
        import horovod.tensorflow.keras as hvd_keras

        callbacks.append(hvd_keras.callbacks.LearningRateWarmupCallback(
            initial_lr=args.warmup_lr, warmup_epochs=args.warmup_epochs,
            momentum_correction=not args.no_momentum_correction))  # fmt: skip
    if args.tensorboard:  # as users add it: on every rank, into one shared folder
        freq, profile = args.tensorboard_update_freq, args.tensorboard_profile_batch
        callbacks.append(keras.callbacks.TensorBoard(log_dir=args.tensorboard, update_freq=int(freq) if freq.isdigit()
                                                     else freq, profile_batch=int(profile) if profile.isdigit()
                                                     else tuple(int(b) for b in profile.split(","))))  # fmt: skip
    return callbacks


def record_union_evaluation(model, sizes: tuple[int, ...]) -> None:
    """The same weights evaluated in one process on every rank's samples together: the truth of --uneven."""
    union = [data(r, sizes[r]) for r in range(hvd.size())]
    union_val = [data(r, sizes[r] // 2, seed=10) for r in range(hvd.size())]
    for name, parts in (("union_train", union), ("union_val", union_val)):
        ux, uy = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        result = model.evaluate(ux, uy, batch_size=1000, verbose=0, return_dict=True)
        record[name] = {k: float(v) for k, v in result.items()}


def record_process_state() -> None:
    """What the process holds once training is over: threads, and whether AzureML's plugin was loaded."""
    record["size"] = hvd.size()
    record["host"] = socket.gethostname()
    record["pid"] = os.getpid()
    record["finished"] = True
    record["threads"] = sorted(t.name for t in threading.enumerate())
    auth = sys.modules.get("azureml.mlflow._common._authentication.azureml_token_authentication")
    record["azureml_plugin_loaded"] = auth is not None
    record["token_refresh_daemon"] = bool(auth and auth.AzureMLTokenAuthentication._daemon is not None)


def main() -> None:
    args = parse_args()
    if args.audit:
        audit_connections()
    if args.stray_writers:  # as many scripts do, before anything else (so before hvd_mlflow.autolog)
        import mlflow.tensorflow

        mlflow.tensorflow.autolog()
    hvd.init()
    # registered first, so it runs last at exit (after hvd-mlflow's, Horovod's and MLflow's own exit hooks)
    atexit.register(lambda: (args.out / f"exit{hvd.rank()}.json").write_text(json.dumps({"at": time.time()})))
    record["train_begin_at"] = time.time()
    logging.basicConfig(level=logging.INFO, format=f"[rank {hvd.rank()}] %(name)s %(levelname)s: %(message)s")
    logging.getLogger("hvd_mlflow").setLevel(logging.INFO)
    rank = hvd.rank()
    options = hvd_mlflow_options(args)
    if not (args.explicit_callback or extra_logs(args)):
        hvd_mlflow.autolog(**options)
    spy(args)
    keras.utils.set_random_seed(7)
    model = compiled_model(args, rank)
    sizes = UNEVEN_SIZES[: hvd.size()] if args.uneven else (args.samples,) * hvd.size()
    x, y = data(rank, sizes[rank])
    xv, yv = data(rank, sizes[rank] // 2, seed=10)
    callbacks = fit_callbacks(args, model, options)
    validation = None if args.no_validation else (xv, yv)
    if args.transfer_recipe:  # keras-io guides/transfer_learning.py: the "base" frozen, a new optimizer
        model.layers[0].trainable = False
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy", metrics=["accuracy"])
    # --uneven: the same 3 training steps on every rank (Horovod averages gradients each step), batches of each size
    batch = -(-sizes[rank] // 3) if args.uneven else 16
    try:
        history = model.fit(x, y, batch_size=batch, validation_batch_size=16, epochs=args.epochs,
                            validation_data=validation, callbacks=callbacks, verbose=0,
                            initial_epoch=args.initial_epoch)  # fmt: skip
    except RuntimeError:
        if not args.catch_and_collect:
            raise
        history = None
    if history is None:  # out of the except block: its traceback no longer holds fit's frames
        ours = [weakref.ref(c) for c in callbacks if isinstance(c, hvd_mlflow.HorovodMlflowCallback)]
        callbacks.clear()  # a script that caught the error keeps no callback: nothing but the exit hook is left
        record["collected"] = gc.collect()
        record["callback_collected"] = [r() is None for r in ours]
        save(args.out)
        return
    record["train_end_s"] = time.perf_counter() - record["_train_end_began"]  # autolog ends the fit after Keras'
    record["fit_returned_at"] = time.time()
    record["history"] = {k: [float(v) for v in vs] for k, vs in history.history.items()}
    if args.then_fit_to:  # the same model goes on, in the same run, from where it stopped
        more = model.fit(x, y, batch_size=16, epochs=args.then_fit_to, initial_epoch=args.epochs,
                         validation_data=(xv, yv), callbacks=callbacks, verbose=0)  # fmt: skip
        record["history_second_fit"] = {k: [float(v) for v in vs] for k, vs in more.history.items()}
    if args.transfer_recipe:  # the guide's fine-tuning: unfreeze, compile again (a low rate), fit again from epoch 0
        model.layers[0].trainable = True
        model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="binary_crossentropy", metrics=["accuracy"])
        more = model.fit(x, y, batch_size=16, epochs=args.transfer_recipe, validation_data=validation,
                         callbacks=callbacks, verbose=0)  # fmt: skip
        record["history_second_fit"] = {k: [float(v) for v in vs] for k, vs in more.history.items()}
    if args.uneven and rank == 0:
        record_union_evaluation(model, sizes)
    if args.probe:
        probe = data(0, 4, seed=99)[0]
        record["probe_x"], record["probe_y"] = probe.tolist(), model.predict(probe, verbose=0).ravel().tolist()
    record_process_state()
    save(args.out)


if __name__ == "__main__":
    main()
