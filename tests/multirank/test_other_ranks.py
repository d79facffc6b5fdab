"""A user's own MLflow script on rank 1 of 2 (real horovodrun, real server): every call returns what MLflow's
signature promises, built without a request (rank 1 sends nothing), so the script runs as it does on rank 0."""

from __future__ import annotations

import uuid

import pytest

from tests.support import launch
from tests.support.checks import report
from tests.support.proxy import Proxy

pytestmark = [pytest.mark.multirank, pytest.mark.shared, pytest.mark.timeout(600)]

WORKER = launch.WORKER.parent / "user_script_worker.py"


@pytest.mark.once
def test_a_tutorial_script_runs_on_rank_1_without_a_request(tmp_path, mlflow_server, client):
    """The ids rank 1 gets are the real ones where it knows them (the job's experiment and run, from the
    environment) and values that name hvd-mlflow and the rank where only rank 0 can know them (a new
    experiment's, a new run's, a new model's): a read of one fails on rank 1 at once, without a request."""
    name = f"tutorial-{uuid.uuid4().hex[:8]}"
    experiment_id = client.create_experiment(name)  # the job's experiment and run, named by the environment
    job_run = client.create_run(experiment_id).info.run_id
    with Proxy(mlflow_server.url) as rank1_server:
        done = launch.run(tmp_path, ["tutorial", "--rank1-uri", rank1_server.url, "--experiment", name],
                          worker=WORKER, timeout=400, env={"MLFLOW_TRACKING_URI": mlflow_server.url,
                          "MLFLOW_EXPERIMENT_ID": experiment_id, "MLFLOW_EXPERIMENT_NAME": name,
                          "MLFLOW_RUN_ID": job_run, "HVD_MLFLOW_TESTING": "1"})  # fmt: skip
        requests = list(rank1_server.requests)
    done.check()
    rank0, rank1 = done.rank(0), done.rank(1)
    assert rank0["errors"] == [], rank0["errors"]
    assert rank1["errors"] == [], rank1["errors"]
    assert requests == [], [f"{r.method} {r.path}" for r in requests]
    seen0, seen1 = rank0["seen"], rank1["seen"]
    assert seen1["experiment"] == seen0["experiment"] == [name, experiment_id, "active"]
    run_id = seen0["run"][0]
    assert seen1["run"] == seen0["run"] == [job_run, experiment_id, "tutorial", "RUNNING"]
    assert seen1["active"] == job_run and seen1["active_after"] is True
    assert seen1["log_param"] == seen0["log_param"] == 16
    artifact_path, model_uri, model_run, flavors, version, has_uuid, has_time = seen1["model_info"]
    assert artifact_path == "model"  # rank 0's is where the server stored it, which only the server knows
    assert model_uri == "models:/hvd-mlflow:rank-1:unknown-model-id" and seen0["model_info"][1].startswith("models:/m-")
    assert model_run == job_run and seen0["model_info"][2] == job_run
    assert set(flavors) <= set(seen0["model_info"][3]) and "tensorflow" in flavors
    assert version == seen0["model_info"][4] and has_uuid and has_time
    assert seen1["created_experiment"] == "hvd-mlflow:rank-1:unknown-experiment-id"
    assert client.get_experiment(seen0["created_experiment"]).name == f"{name}-more"  # rank 0's is real
    assert seen1["more_run"] == seen0["more_run"] == [True, "more", "RUNNING"]
    assert seen1["more_run_id"] == "hvd-mlflow:rank-1:unknown-run-id"
    assert seen0["read_more_run"] == seen0["more_run_id"] == client.get_run(seen0["more_run_id"]).info.run_id
    assert seen1["read_more_run"].startswith("MlflowException: hvd-mlflow: MlflowClient.get_run() was given "
                                             "'hvd-mlflow:rank-1:unknown-run-id'"), seen1["read_more_run"]  # fmt: skip
    assert seen1["client_log_param"] == seen0["client_log_param"] == "v"
    run = client.get_run(run_id)
    for key in ("final_score", "client_metric", "a", "loss"):  # one writer: every user point once
        assert len(client.get_metric_history(run_id, key)) == (2 if key == "loss" else 1), key
    assert run.data.params["batch_size"] == "16" and run.data.tags["stage"] == "tutorial"
    report("tutorial_rank1", requests_from_rank1=len(requests), errors=len(rank1["errors"]))
