"""Trainings that check hvd-mlflow never breaks, stalls or hangs training: one named scenario per run.

    horovodrun -np 2 -H localhost:2 --gloo python robust_worker.py --out DIR SCENARIO [options]

Scenarios (each rank writes ``rank<R>.json`` in ``--out``):

* ``faults``: one baseline fit without hvd-mlflow, then one fit per rank-0-only step of hvd-mlflow, each with
  that step made to raise on rank 0 (:data:`INJECTIONS`). Every fit starts from the same weights and data, so its
  final weights must equal the baseline's. Records, per fit: seconds, final weights, rank 0's hvd-mlflow warnings;
  a fit more than ``--again-after`` seconds slower than the baseline on rank 0 runs once more (``again_seconds``).
* ``resume-recipe``: Horovod's resume recipe: rank 0 alone restores its optimizer's iteration count (and weights),
  the other ranks start fresh, and the state is broadcast from rank 0 at the end of the first batch (Horovod's
  ``BroadcastGlobalVariablesCallback`` where it works, else the project's own broadcast).
* ``guard``: rank 1 is pointed at its own tracking URI and tries every MLflow write path.
* ``callback-list``: ``fit(callbacks=<a Keras CallbackList>)`` with ``autolog()``.
* ``compiled-fault``: rank 1's compiled computation of results from summed states fails once (at the epoch end
  ``--fail-at``), as a rank's own trouble would (memory, a thread); per epoch end each rank records which path it
  computed on (compiled calls made) and the values every later callback saw, with ``EarlyStopping(min_delta=0)``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
from common import (
    FLAVOUR,
    KERAS_MAJOR,
    Record,
    SeenLogs,
    data,
    keras,
    keras_module,
    small_model,
    spy_local_logs,
    weights,
)

import hvd_mlflow
from hvd_mlflow.delivery import destination, journal, sender
from hvd_mlflow.every_rank import keras_flavour, metric_state, names, run_params, tensorboard
from hvd_mlflow.rank_zero import model_logging


class Capture(logging.Handler):
    """hvd-mlflow's warnings, as rank 0 says them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _raises(error: BaseException) -> Callable[..., object]:
    def fail(*args: object, **kwargs: object) -> object:
        raise error

    return fail


def _after_calls(original: Callable[..., object], calls: int, error: BaseException) -> Callable[..., object]:
    count = {"n": 0}

    def maybe_fail(*args: object, **kwargs: object) -> object:
        count["n"] += 1
        if count["n"] > calls:
            raise error
        return original(*args, **kwargs)

    return maybe_fail


def _param_names_fail(original: Callable[..., object]) -> Callable[..., object]:
    def call(self, names_: object) -> object:
        if self._what == "param":
            raise UnicodeError("injected: cannot clean a param name")
        return original(self, names_)

    return call


# Every rank-0-only step: (owner, attribute, replacement factory). Only rank 0 is patched.
_FILE_JOURNAL = getattr(journal, "FileJournal", None) or journal.Journal  # (older versions: Journal)
INJECTIONS: dict[str, tuple[object, str, Callable[[Callable[..., object]], Callable[..., object]]]] = {
    "journal create": (_FILE_JOURNAL, "create",
                       lambda o: _raises(sqlite3.OperationalError("injected: disk I/O error"))),
    "journal append": (_FILE_JOURNAL, "append_many",  # every append goes through it
                       lambda o: _after_calls(o, 3, sqlite3.OperationalError("injected: database or disk is full"))),
    "params": (run_params, "training_params", lambda o: _raises(RuntimeError("injected: params"))),
    "learning rate": (run_params, "current_learning_rate", lambda o: _raises(ValueError("injected: lr schedule"))),
    "param names": (names.NameMap, "__call__", _param_names_fail),
    "sender start": (sender.Sender, "start", lambda o: _raises(RuntimeError("injected: can't start new thread"))),
    "run resolution": (destination, "resolve", lambda o: _raises(RuntimeError("injected: no destination"))),
    "model logging": (model_logging, "log_model", lambda o: _raises(OSError("injected: model save failed"))),
    "CSV file": (keras_flavour, "csv_logger", lambda o: _raises(PermissionError("injected: read-only csv"))),
    "TensorBoard folders": (tensorboard, "uploads", lambda o: _raises(OSError("injected: unreadable log folder"))),
}  # fmt: skip


@contextlib.contextmanager
def injected(name: str, rank: int) -> Iterator[None]:
    if rank != 0 or name == "baseline":
        yield
        return
    owner, attribute, factory = INJECTIONS[name]
    original = getattr(owner, attribute, None)
    if original is None:  # not a step of this version of hvd-mlflow
        yield
        return
    setattr(owner, attribute, factory(original))
    try:
        yield
    finally:
        setattr(owner, attribute, original)


def faults(args: argparse.Namespace, record: Record) -> None:
    rank = hvd.rank()
    spy_local_logs(record)
    capture = Capture()
    logging.getLogger("hvd_mlflow").addHandler(capture)
    x, y = data(rank, 96)
    xv, yv = data(rank, 48, seed=10)
    record["fits"] = {}
    os.environ["HVD_MLFLOW_TESTING"] = "0"  # the guards degrade here, as for users

    def fit(name: str, tag: str) -> tuple[float, keras.callbacks.History, keras.Model]:
        if name == "baseline":
            hvd_mlflow.autolog(disable=True)
        else:
            hvd_mlflow.autolog(extra_tags={"test.fault": tag}, log_models=name == "model logging",
                               csv_path=str(args.out / f"csv-{rank}.csv") if name == "CSV file" else None)  # fmt: skip
        model = small_model()
        capture.messages.clear()
        # the earlier fits' garbage collected now, not inside this fit: freeing a TensorFlow graph can hold rank 0
        # for seconds (a 2.7 s gen-2 collection seen in the CSV fault's fit, and fits up to 17 s over the baseline)
        gc.collect()
        hvd.allreduce(np.zeros(1), name=f"sync.{tag}")  # every fit starts together
        start = time.perf_counter()
        with injected(name, rank):
            history = model.fit(x, y, batch_size=16, epochs=args.epochs, validation_data=(xv, yv), verbose=0)
        return time.perf_counter() - start, history, model

    for name in ["baseline", *INJECTIONS]:
        seconds, history, model = fit(name, name)
        record["fits"][name] = {
            "seconds": seconds,
            "weights": weights(model),
            "warnings": list(capture.messages),
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
            "local": record["local"][-1],
        }
        # A fit slower than the baseline by more than --again-after on rank 0 runs once more (rank 0 decides, every
        # rank follows): a wait hvd-mlflow adds comes back, a stall of a loaded machine does not.
        if name != "baseline":
            slow = seconds - record["fits"]["baseline"]["seconds"] > args.again_after
            if float(np.asarray(hvd.broadcast(np.array([float(slow)]), root_rank=0, name=f"again.{name}"))[0]):
                record["fits"][name]["again_seconds"] = fit(name, f"{name} (again)")[0]
        record.save()


class OwnBroadcast(keras.callbacks.Callback):
    """Rank 0's model and optimizer state to every rank at the end of the first batch (what Horovod's
    ``BroadcastGlobalVariablesCallback`` does, for Keras 3 where Horovod's does not work)."""

    done = False

    def on_train_batch_end(self, batch, logs=None):
        if self.done:
            return
        self.done = True
        variables = list(self.model.variables) + list(self.model.optimizer.variables)
        for i, variable in enumerate(variables):
            variable.assign(hvd.broadcast(variable, root_rank=0, name=f"own_broadcast.{i}"))


def resume_recipe(args: argparse.Namespace, record: Record) -> None:
    """Three fits in one job: without hvd-mlflow (Horovod's side of the recipe alone), then with per-batch logging
    every ``--log-every-n-steps`` with ``steps_per_execution`` 1 and 2. Each starts as the recipe does: rank 0 alone
    restored its optimizer's step and weights, the others are fresh, the broadcast comes at the end of batch 0."""
    rank = hvd.rank()
    record["fits"] = {}
    for label, every, per_execution in (("without", 0, 1), ("k1", args.log_every_n_steps, 1),
                                        ("k2", args.log_every_n_steps, 2)):  # fmt: skip
        if every:
            hvd_mlflow.autolog(log_every_n_steps=every, extra_tags={"recipe": label})
        else:
            hvd_mlflow.autolog(disable=True)
        model = small_model(steps_per_execution=per_execution)
        x, y = data(rank, 96)
        if rank == 0:  # what hvd.load_model / a checkpoint restore does, on rank 0 alone
            model.optimizer.iterations.assign(args.restored_step)
            model.set_weights([w + 0.1 for w in model.get_weights()])
        at_start = int(np.asarray(model.optimizer.iterations))
        if args.broadcast == "horovod":
            import horovod.tensorflow.keras as hvd_keras

            broadcast = hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)
        else:
            broadcast = OwnBroadcast()
        model.fit(x, y, batch_size=16, epochs=args.epochs, callbacks=[broadcast], verbose=0)
        record["fits"][label] = {"iterations_at_start": at_start,
                                 "iterations_at_end": int(np.asarray(model.optimizer.iterations))}  # fmt: skip
        record.save()
    record["finished"] = True
    record.save()


def guard(args: argparse.Namespace, record: Record) -> None:
    rank = hvd.rank()
    if rank == 1:  # its own server (a counting proxy), as a script that sets it on every rank would
        os.environ["MLFLOW_TRACKING_URI"] = args.rank1_uri
    import mlflow
    import mlflow.tensorflow
    from mlflow import MlflowClient, log_metric  # imported before autolog(): the guard must still hold

    hvd_mlflow.autolog()
    model = small_model()
    x, y = data(rank, 64)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    errors = []
    for what, call in [
        ("log_metric imported before autolog", lambda: log_metric("stray", 1.0)),
        ("mlflow.log_params", lambda: mlflow.log_params({"stray": 1})),
        ("MlflowClient().log_metric", lambda: MlflowClient().log_metric(args.run_id, "stray", 1.0)),
        ("MlflowClient().set_tag", lambda: MlflowClient().set_tag(args.run_id, "stray", "1")),
        ("start_run + active_run", lambda: _start_run_and_read(mlflow, record)),
        ("mlflow.tensorflow.log_model", lambda: mlflow.tensorflow.log_model(model, name="stray")),
    ]:
        if rank == 0:
            continue  # rank 0 writes normally; the test looks at what rank 1 sent
        try:
            call()
        except Exception as error:  # noqa: BLE001 - recorded for the test
            errors.append(f"{what}: {type(error).__name__}: {error}")
    record["errors"] = errors
    record["finished"] = True
    record.save()


def _start_run_and_read(mlflow: object, record: Record) -> None:
    with mlflow.start_run():  # type: ignore[attr-defined]
        record["active_run_id"] = mlflow.active_run().info.run_id  # type: ignore[attr-defined]
    record["active_after_end"] = mlflow.active_run() is None  # type: ignore[attr-defined]


def callback_list(args: argparse.Namespace, record: Record) -> None:
    rank = hvd.rank()
    hvd_mlflow.autolog()
    spy_local_logs(record)
    model = small_model()
    x, y = data(rank, 96)
    xv, yv = data(rank, 48, seed=10)
    given = keras_module.callbacks.CallbackList([SeenLogs(record)], add_history=True, model=model)
    record["callback_list_class"] = f"{type(given).__module__}.{type(given).__name__}"
    model.fit(x, y, batch_size=16, epochs=args.epochs, validation_data=(xv, yv), callbacks=given, verbose=0)
    record["finished"] = True
    record.save()


def compiled_fault(args: argparse.Namespace, record: Record) -> None:
    rank = hvd.rank()
    computer_call = metric_state._Computer._call
    calls: dict = {"epoch": -1, "failed": False, "compiled": []}  # compiled calls made at each epoch's end

    def call(concrete, summed):
        if rank == 1 and calls["epoch"] == args.fail_at and not calls["failed"]:
            calls["failed"] = True
            raise MemoryError("injected: rank 1's compiled call failed")
        calls["compiled"][-1] += 1
        return computer_call(concrete, summed)

    class Counter(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            calls["epoch"] = epoch
            calls["compiled"].append(0)

    metric_state._Computer._call = staticmethod(call)
    hvd_mlflow.autolog(log_every_n_steps=1)
    model = small_model(learning_rate=0.05)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy",
                  metrics=["accuracy", keras.metrics.AUC(name="auc")])  # fmt: skip
    x, y = data(rank, 96)
    xv, yv = data(rank, 48, seed=10)
    seen = SeenLogs(record)
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=0, patience=3)
    history = model.fit(x, y, batch_size=16, epochs=args.epochs, validation_data=(xv, yv), verbose=0,
                        callbacks=[Counter(), seen, stop])  # fmt: skip
    record["compiled_calls"] = calls["compiled"]
    record["epochs_run"] = len(history.history["loss"])
    healthy = getattr(metric_state, "healthy", None)  # (older versions: none)
    record["fell_back"] = not healthy(model) if healthy else None
    record.save()


SCENARIOS = {"faults": faults, "resume-recipe": resume_recipe, "guard": guard, "callback-list": callback_list,
             "compiled-fault": compiled_fault}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--log-every-n-steps", type=int, default=0)
    parser.add_argument("--restored-step", type=int, default=10)
    parser.add_argument("--broadcast", choices=["horovod", "own"], default="own")
    parser.add_argument("--rank1-uri", default="")
    parser.add_argument("--run-id", default="")
    parser.add_argument("--fail-at", type=int, default=2)  # compiled-fault: the epoch end rank 1's call fails at
    parser.add_argument("--again-after", type=float, default=float("inf"))  # faults: seconds over the baseline
    args = parser.parse_args()
    hvd.init()
    logging.basicConfig(level=logging.INFO, format=f"[rank {hvd.rank()}] %(name)s %(levelname)s: %(message)s")
    logging.getLogger("hvd_mlflow").setLevel(logging.INFO)
    record = Record(args.out, hvd.rank())
    record["scenario"], record["keras"] = args.scenario, f"{FLAVOUR} {KERAS_MAJOR}"
    SCENARIOS[args.scenario](args, record)
    print(f"[rank {hvd.rank()}] done", file=sys.stderr)


if __name__ == "__main__":
    main()
