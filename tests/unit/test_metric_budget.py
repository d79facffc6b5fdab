from __future__ import annotations

from hvd_mlflow.delivery.metric_budget import MetricBudget


def test_the_budget_goes_to_names_in_priority_order():
    budget = MetricBudget(limit=6, existing={"old_metric"}, user_names={"dataset_size"})
    budget.settle(["batch/loss", "loss_rank_min", "learning_rate", "val_loss", "loss", "auc", "val_auc",
                   "epoch_time_s"])  # fmt: skip
    # 2 places are taken (what the run holds, the user's): loss, auc, val_loss, val_auc fill the other 4
    assert [n for n in ["loss", "auc", "val_loss", "val_auc"] if budget.admits(n)] == ["loss", "auc", "val_loss",
                                                                                          "val_auc"]  # fmt: skip
    assert budget.over == ["learning_rate", "epoch_time_s", "loss_rank_min", "batch/loss"]
    assert budget.admits("old_metric") and budget.admits("dataset_size")
    assert not budget.admits("a_new_name")  # no room left for a name first seen later
    assert budget.over[-1] == "a_new_name"


def test_a_name_first_seen_later_gets_a_place_while_one_is_left():
    budget = MetricBudget(limit=3)
    budget.settle(["loss", "val_loss"])
    assert budget.admits("batch/loss") and not budget.admits("batch/accuracy")
    assert budget.over == ["batch/accuracy"]


def test_no_limit_admits_everything():
    budget = MetricBudget(limit=None)
    assert budget.settled and all(budget.admits(f"m{i}") for i in range(500)) and budget.over == []


def test_the_optional_names_leave_a_tenth_of_the_places_for_the_user_s_later_names():
    from hvd_mlflow.delivery.metric_budget import run_names

    names = run_names("run-reserve", limit=20)
    budget = MetricBudget(limit=20, user_names={"dataset_size"}, names=names)  # 2 kept, 1 taken by dataset_size
    keras = [f"m{i}" for i in range(8)] + [f"val_m{i}" for i in range(8)]
    budget.settle([*keras, "learning_rate", "m0_rank_min", "m0_rank_max", "batch/m0", "batch/m1"])
    assert all(budget.admits(k) for k in keras) and budget.admits("learning_rate")  # 18 with dataset_size
    assert budget.admits("m0_rank_min")  # the 19th place: 1 still free for the user
    assert not budget.admits("m0_rank_max") and budget.over[0] == "m0_rank_max"  # it would take the user's place
    assert names.admit("user_score")  # the user's later name: the place kept
    assert not names.admit("test_score") and len(names.names) == 20  # never past the limit, whoever logs


def test_the_user_s_names_are_kept_by_run(monkeypatch):
    """Names a user logged into one run take no place in another run's budget (they were process-wide: an earlier
    run's names, in the same process, took places in every later run's)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    from hvd_mlflow.delivery import mlflow_calls

    monkeypatch.setattr(mlflow_calls, "_user_metrics", {})
    mlflow_calls._within_run_budget(
        "MlflowClient.log_metric", MlflowClient.log_metric, (None, "run-a", "score", 1.0), {}
    )
    mlflow_calls._within_run_budget(
        "MlflowClient.log_batch",
        MlflowClient.log_batch,
        (None,),
        {"run_id": "run-b", "metrics": [Metric("f1", 1.0, 0, 0)]},
    )
    mlflow_calls._rank_zero_only("log_metric", lambda key, value: None)("ignored", 1.0)  # fluent: noted in the client
    assert mlflow_calls.user_metric_names("run-a") == ["score"]
    assert mlflow_calls.user_metric_names("run-b") == ["f1"] and mlflow_calls.user_metric_names("run-c") == []
