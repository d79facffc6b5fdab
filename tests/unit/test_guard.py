"""The guard on a rank other than 0: every MLflow write path is a no-op; hvd-mlflow's own sender passes."""

from __future__ import annotations

import mlflow
from mlflow import MlflowClient

from hvd_mlflow.common import compat
from hvd_mlflow.common.topology import Topology
from hvd_mlflow.delivery import mlflow_calls as guard


def test_every_write_path_is_a_no_op_on_rank_1_and_the_rank_is_asked_at_each_call(tmp_path, monkeypatch):
    from mlflow import log_metric as imported_before  # as a script that imports it before autolog()

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    rank = {"now": 1}
    monkeypatch.setattr(guard.topology, "current", lambda: Topology(rank["now"], 2, rank["now"], "test"))
    guard.install(1, "the-job-run", job_mode=False)
    try:
        imported_before("stray", 1.0)
        mlflow.log_params({"stray": 1})
        assert MlflowClient().create_run("0").info.run_id == "the-job-run"  # a run object, nothing created
        MlflowClient().log_metric("the-job-run", "stray", 1.0)
        with mlflow.start_run() as run:
            assert run.info.run_id == mlflow.active_run().info.run_id == "the-job-run"
        assert mlflow.active_run() is None
        assert "stray" not in guard.user_metric_names()  # the budget never counts what rank 1 tried to log
        with guard.internal():  # hvd-mlflow's own sender, in a process that stopped being rank 0 mid-request
            internal_experiment = MlflowClient().create_experiment("written-by-the-sender")
        rank["now"] = 0  # an elastic reset made this process rank 0: its writes go through again
        MlflowClient().create_experiment("written-as-rank-0")
    finally:
        guard.uninstall()
        mlflow.set_tracking_uri(None)
    client = MlflowClient(uri)
    names = sorted(e.name for e in client.search_experiments())
    assert names == ["Default", "written-as-rank-0", "written-by-the-sender"], names
    assert client.search_runs(["0", internal_experiment]) == []  # no stray run, no stray point


def test_other_ranks_get_what_mlflow_promises_without_writing(tmp_path, monkeypatch):
    import mlflow.pyfunc
    from mlflow.entities import Experiment, Run
    from mlflow.entities.model_registry import ModelVersion, RegisteredModel
    from mlflow.models.model import ModelInfo

    mlflow3 = compat.mlflow3()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    monkeypatch.setattr(guard.topology, "current", lambda: Topology(1, 2, 1, "test"))
    guard.install(1, None, job_mode=False)
    try:
        experiment = mlflow.set_experiment("x")
        assert isinstance(experiment, Experiment) and (experiment.name, experiment.experiment_id) == ("x", "0")
        monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", "17")  # the job's experiment
        assert mlflow.set_experiment("y").experiment_id == "17"
        assert mlflow.set_experiment(experiment_id="5").experiment_id == "5"
        with mlflow.start_run(run_name="r") as run:
            assert (run.info.experiment_id, run.info.run_name, run.info.status) == ("5", "r", "RUNNING")
            assert mlflow.log_param("k", 3) == 3
            # nothing is saved: any object will do; MLflow 3 names the model `name`, 2.x `artifact_path`
            info = mlflow.pyfunc.log_model(**{"name" if mlflow3 else "artifact_path": "net"}, python_model=object())
        assert isinstance(info, ModelInfo) and info.artifact_path == "net" and "python_function" in info.flavors
        if mlflow3:  # a logged model
            assert info.model_uri.startswith("models:/m-") and info.model_id == info.model_uri.split("/")[-1]
        else:
            assert info.model_uri == f"runs:/{run.info.run_id}/net"
        assert info.run_id == run.info.run_id
        client = MlflowClient()
        assert isinstance(mlflow.create_experiment("z"), str) and isinstance(client.create_experiment("z"), str)
        assert isinstance(client.create_run("5"), Run) and client.log_param("run", "k", "v") == "v"
        if mlflow3:  # MLflow 2.x has no logged models
            from mlflow.entities import LoggedModel

            model = client.create_logged_model("5", name="m", params={"a": 1})
            assert isinstance(model, LoggedModel) and model.params == {"a": "1"} and model.name == "m"
        assert isinstance(client.create_registered_model("reg"), RegisteredModel)
        version = client.create_model_version("reg", "models:/m-1", run_id="run")
        assert isinstance(version, ModelVersion) and (version.name, version.run_id) == ("reg", "run")
        assert mlflow.log_metric("m", 1.0) is None
    finally:
        guard.uninstall()
        mlflow.set_tracking_uri(None)
    client = MlflowClient(uri)
    assert [e.name for e in client.search_experiments()] == ["Default"]
    assert client.search_runs(["0"]) == [] and client.search_registered_models() == []
