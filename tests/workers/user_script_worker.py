"""What users' own scripts do around hvd-mlflow, on every rank: one named scenario per run.

    horovodrun -np 2 -H localhost:2 --gloo python user_script_worker.py --out DIR SCENARIO [options]

Scenarios (each rank writes ``rank<R>.json`` in ``--out``):

* ``tutorial``: the MLflow tutorial's lines on every rank (experiment, run context, params, metrics, a model,
  artifacts, ``MlflowClient`` calls that use what the earlier calls returned), around an autologged ``fit``.
  ``--rank1-uri`` points rank 1 at its own tracking URI (a recording proxy). Records every call's error and what
  the results held, and what a read of the run ``client.create_run`` returned gives (rank 1: hvd-mlflow's error).
* ``empty-shard``: one fit per part named in ``--empty`` (``validation,training``), each with rank 1's shard of
  that part empty, as when a dataset is sharded over more ranks than it has files. Records, per fit, what ``fit``
  did on each rank: its error, or the values every rank's later callbacks saw, and Keras' own local values.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from pathlib import Path

import horovod.tensorflow as hvd
from common import FLAVOUR, KERAS_MAJOR, Record, SeenLogs, data, small_model, spy_local_logs

import hvd_mlflow


def tutorial(args: argparse.Namespace, record: Record) -> None:
    rank = hvd.rank()
    if rank == 1:  # its own server (a counting proxy), as a script that sets it on every rank would
        os.environ["MLFLOW_TRACKING_URI"] = args.rank1_uri
    import mlflow
    import mlflow.tensorflow
    from mlflow import MlflowClient

    hvd_mlflow.autolog()
    model = small_model()
    x, y = data(rank, 64)
    errors: list[str] = []
    seen: dict[str, object] = {}

    def step(what: str, call):
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - recorded for the test
            errors.append(f"{what}: {type(error).__name__}: {error}\n{traceback.format_exc(limit=4)}")
            return None

    experiment = step("set_experiment", lambda: mlflow.set_experiment(args.experiment))
    if experiment is not None:
        seen["experiment"] = [experiment.name, experiment.experiment_id, experiment.lifecycle_stage]
    client = MlflowClient()
    try:
        with mlflow.start_run(experiment_id=experiment.experiment_id, run_name="tutorial") as run:
            seen["run"] = [run.info.run_id, run.info.experiment_id, run.info.run_name, run.info.status]
            step("log_params", lambda: mlflow.log_params({"hidden": 8, "optimizer": "sgd"}))
            seen["log_param"] = step("log_param", lambda: mlflow.log_param("batch_size", 16))
            step("set_tag", lambda: mlflow.set_tag("stage", "tutorial"))
            step("fit", lambda: model.fit(x, y, batch_size=16, epochs=2, verbose=0))
            step("log_metric", lambda: mlflow.log_metric("final_score", 0.5))
            step("log_metrics", lambda: mlflow.log_metrics({"a": 1.0, "b": 2.0}, step=1))
            info = step("log_model", lambda: mlflow.tensorflow.log_model(model, name="model"))
            if info is not None:
                seen["model_info"] = [
                    *(info.artifact_path, info.model_uri, info.run_id, sorted(info.flavors), info.mlflow_version),
                    *(bool(info.model_uuid), bool(info.utc_time_created)),
                ]
                step("client.set_tag(model_uri)", lambda: client.set_tag(run.info.run_id, "model_uri", info.model_uri))
            step("log_dict", lambda: mlflow.log_dict({"layers": 2}, "config.json"))
            step("log_text", lambda: mlflow.log_text("a note", "notes.txt"))
            step("client.log_metric", lambda: client.log_metric(run.info.run_id, "client_metric", 1.0))
            seen["active"] = step("active_run", lambda: mlflow.active_run().info.run_id)
    except Exception as error:  # noqa: BLE001 - recorded for the test
        errors.append(f"run context: {type(error).__name__}: {error}\n{traceback.format_exc(limit=4)}")
    seen["active_after"] = mlflow.active_run() is None
    other = step("client.create_experiment", lambda: client.create_experiment(f"{args.experiment}-more"))
    seen["created_experiment"] = other
    if other is not None:
        more = step("client.create_run", lambda: client.create_run(other, run_name="more"))
        if more is not None:
            seen["more_run"] = [more.info.experiment_id == other, more.info.run_name, more.info.status]
            seen["more_run_id"] = more.info.run_id
            seen["client_log_param"] = step("client.log_param", lambda: client.log_param(more.info.run_id, "k", "v"))
            try:  # a read of the new run: its id is the server's, known on rank 0 only
                seen["read_more_run"] = client.get_run(more.info.run_id).info.run_id
            except Exception as error:  # noqa: BLE001 - recorded for the test
                seen["read_more_run"] = f"{type(error).__name__}: {error}"
            step("client.set_terminated", lambda: client.set_terminated(more.info.run_id))
    record["errors"], record["seen"] = errors, seen
    record["finished"] = True
    record.save()


def empty_shard(args: argparse.Namespace, record: Record) -> None:
    rank = hvd.rank()
    hvd_mlflow.autolog()
    spy_local_logs(record)  # Keras' own epoch logs, one list per fit that Keras began, under record["local"]
    for empty in args.empty.split(","):
        fit: dict[str, object] = {}
        model = small_model()
        x, y = data(rank, 48)
        xv, yv = data(rank, 24, seed=10)
        if rank == 1 and empty == "training":
            x, y = x[:0], y[:0]
        if rank == 1 and empty == "validation":
            xv, yv = xv[:0], yv[:0]
        if empty == "steps":  # not empty: 4 training steps of 16 on rank 0, 3 on rank 1
            x, y = data(rank, 64 if rank == 0 else 48)
        start = time.monotonic()
        try:
            model.fit(x, y, batch_size=16, epochs=args.epochs, validation_data=(xv, yv), callbacks=[SeenLogs(fit)],
                      verbose=0)  # fmt: skip
            fit["error"] = None
        except Exception as error:  # noqa: BLE001 - recorded for the test
            fit["error"] = [f"{type(error).__module__}.{type(error).__name__}", str(error)]
        fit["seconds"] = time.monotonic() - start
        record.setdefault("fits", {})[empty] = fit
        record.save()
    record["finished"] = True
    record.save()


SCENARIOS = {"tutorial": tutorial, "empty-shard": empty_shard}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rank1-uri", default="")
    parser.add_argument("--experiment", default="tutorial")
    parser.add_argument("--empty", default="validation,training",
                        help="comma-separated: training, validation, steps (unequal steps instead)")  # fmt: skip
    args = parser.parse_args()
    hvd.init()
    logging.basicConfig(level=logging.INFO, format=f"[rank {hvd.rank()}] %(name)s %(levelname)s: %(message)s")
    record = Record(args.out, hvd.rank())
    record["scenario"], record["keras"] = args.scenario, f"{FLAVOUR} {KERAS_MAJOR}"
    SCENARIOS[args.scenario](args, record)
    print(f"[rank {hvd.rank()}] done", file=sys.stderr)


if __name__ == "__main__":
    main()
