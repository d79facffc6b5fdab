from __future__ import annotations

import mlflow
import pytest

from hvd_mlflow.delivery import destination


def test_the_environment_names_the_run_the_experiment_and_the_server():
    environ = {
        "MLFLOW_RUN_ID": "r1",
        "MLFLOW_EXPERIMENT_ID": "7",
        "MLFLOW_EXPERIMENT_NAME": "exp",
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
    }
    assert destination.run_id_from_environment(environ) == "r1"
    assert destination.experiment_from_environment(environ) == ("7", "exp")
    assert destination.tracking_uri_from_environment(environ) == "http://127.0.0.1:5000"
    empty = {"MLFLOW_RUN_ID": "", "MLFLOW_EXPERIMENT_ID": "", "MLFLOW_TRACKING_URI": ""}
    assert destination.run_id_from_environment(empty) is None
    assert destination.experiment_from_environment(empty) == (None, None)
    assert destination.tracking_uri_from_environment(empty) is None


@pytest.mark.parametrize(
    ("uri", "azureml_run", "job"),
    [
        ("azureml://eastus.api.azureml.ms/mlflow/v1.0/subscriptions/s", "job-1", True),
        ("azureml://eastus.api.azureml.ms/mlflow/v1.0/subscriptions/s", "", False),
        ("http://127.0.0.1:5000", "job-1", False),
    ],
)
def test_job_mode_needs_the_azureml_scheme_and_a_job_run(uri, azureml_run, job):
    assert destination.is_azureml_job(uri, {"AZUREML_RUN_ID": azureml_run}) is job


def test_resolve_takes_the_experiment_from_the_environment_and_the_job_run_in_job_mode(monkeypatch):
    monkeypatch.setattr(mlflow, "get_tracking_uri", lambda: "azureml://eastus.api.azureml.ms/mlflow/v1.0/x")
    where = destination.resolve(None, {"AZUREML_RUN_ID": "job-1", "MLFLOW_EXPERIMENT_NAME": "exp"})
    assert (where.run_id, where.experiment_name, where.job_mode) == ("job-1", "exp", True)
    assert destination.resolve("captured", {"AZUREML_RUN_ID": "job-1"}).run_id == "captured"
