"""The guard on a rank other than 0: every MLflow write path is a no-op; hvd-mlflow's own sender passes."""

from __future__ import annotations

import mlflow
from mlflow import MlflowClient

from hvd_mlflow import guard
from hvd_mlflow.topology import Topology


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
