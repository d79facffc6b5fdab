"""A user's own MLflow script on rank 1 of 2 (real horovodrun, real server): every call returns what MLflow's
signature promises, built without a request (rank 1 sends nothing), so the script runs as it does on rank 0."""

from __future__ import annotations

import uuid

import pytest

from tests.support import launch
from tests.support.checks import report
from tests.support.proxy import Proxy

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

WORKER = launch.WORKER.parent / "user_script_worker.py"


@pytest.mark.once
def test_a_tutorial_script_runs_on_rank_1_without_a_request(tmp_path, mlflow_server, client):
    name = f"tutorial-{uuid.uuid4().hex[:8]}"
    experiment_id = client.create_experiment(name)  # the job's experiment, named by the environment
    with Proxy(mlflow_server.url) as rank1_server:
        done = launch.run(tmp_path, ["tutorial", "--rank1-uri", rank1_server.url, "--experiment", name],
                          worker=WORKER, timeout=400, env={"MLFLOW_TRACKING_URI": mlflow_server.url,
                          "MLFLOW_EXPERIMENT_ID": experiment_id, "HVD_MLFLOW_TESTING": "1"})  # fmt: skip
        requests = list(rank1_server.requests)
    done.check()
    rank0, rank1 = done.rank(0), done.rank(1)
    assert rank0["errors"] == [], rank0["errors"]
    assert rank1["errors"] == [], rank1["errors"]
    assert requests == [], [f"{r.method} {r.path}" for r in requests]
    seen0, seen1 = rank0["seen"], rank1["seen"]
    assert seen1["experiment"] == seen0["experiment"] == [name, experiment_id, "active"]
    run_id = seen0["run"][0]
    assert seen1["run"][1:] == seen0["run"][1:] == [experiment_id, "tutorial", "RUNNING"]
    assert seen1["active"] == seen1["run"][0] and seen1["active_after"] is True
    assert seen1["log_param"] == seen0["log_param"] == 16
    artifact_path, model_uri, model_run, flavors, version, has_uuid, has_time = seen1["model_info"]
    assert artifact_path == "model"  # rank 0's is where the server stored it, which only the server knows
    assert model_uri.startswith("models:/m-") and seen0["model_info"][1].startswith("models:/m-")
    assert model_run == seen1["run"][0] and seen0["model_info"][2] == run_id
    assert set(flavors) <= set(seen0["model_info"][3]) and "tensorflow" in flavors
    assert version == seen0["model_info"][4] and has_uuid and has_time
    assert seen1["created_experiment_is_str"] is True
    assert seen1["more_run"] == seen0["more_run"] == [True, "more", "RUNNING"]
    assert seen1["client_log_param"] == seen0["client_log_param"] == "v"
    run = client.get_run(run_id)
    for key in ("final_score", "client_metric", "a", "loss"):  # one writer: every user point once
        assert len(client.get_metric_history(run_id, key)) == (2 if key == "loss" else 1), key
    assert run.data.params["batch_size"] == "16" and run.data.tags["stage"] == "tutorial"
    report("tutorial_rank1", requests_from_rank1=len(requests), errors=len(rank1["errors"]))
