"""AzureML's documented per-run limits, through the real azureml-mlflow plugin and the offline front that enforces
them (tests/support/azureml_front.py): 2 real Horovod ranks in an AzureML-like job environment.

* over 50 metric names: the budget keeps the run within 50, every Keras metric whole, the rest in the CSV;
* a resume with 60 changed params: at most 50 tags, the changes in one JSON artifact;
* a metric name the service refuses: every other point of every epoch is there exactly once;
* a per-batch plan over the rows a metric may hold: the interval raised, the rows within the limit;
* a 429 storm over most of the training (run once: it does not depend on the Keras flavour).
"""

from __future__ import annotations

import csv
import json
import uuid

import numpy as np
import pytest

from tests.support import launch
from tests.support.azureml_front import AzureMLFront
from tests.support.checks import FAST_RETRIES, report

pytestmark = [pytest.mark.multirank, pytest.mark.azureml, pytest.mark.once, pytest.mark.timeout(600)]

WORKER = launch.WORKER.parent / "limits_worker.py"


def job(client, front: AzureMLFront, tmp_path, args: list[str], run_id: str | None = None, **extra: str):
    name = f"azureml-limits-{uuid.uuid4().hex[:8]}"
    experiment_id = client.create_experiment(name, artifact_location=front.artifact_location(name))
    run_id = run_id or client.create_run(experiment_id).info.run_id  # the control plane creates the job's run
    env = {**FAST_RETRIES, **front.job_environment(run_id, experiment_id), **extra}
    done = launch.run(tmp_path, args, env=env, timeout=400, worker=WORKER).check()
    return run_id, [done.rank(0), done.rank(1)], done


def history(client, run_id: str, key: str) -> dict[int, float]:
    points = client.get_metric_history(run_id, key)
    steps = [p.step for p in points]
    assert len(steps) == len(set(steps)), (key, steps)  # every point once
    return {p.step: p.value for p in points}


def over_budget_rows(front: AzureMLFront, run_id: str) -> dict[str, dict[int, float]]:
    files = list((front.artifact_dir / f"dcid.{run_id}" / "hvd_mlflow").glob("metrics-over-budget-*.csv"))
    assert len(files) == 1, files
    out: dict[str, dict[int, float]] = {}
    with files[0].open() as f:
        for row in csv.DictReader(f):
            out.setdefault(row["name"], {})[int(row["step"])] = float(row["value"])
    return out


@pytest.fixture
def front(mlflow_server, tmp_path):
    with AzureMLFront(mlflow_server.url, tmp_path / "tls") as front:
        yield front


def test_over_50_metric_names_the_run_keeps_50_every_keras_metric_whole_and_the_rest_in_the_csv(
    tmp_path, client, front
):
    epochs = 3
    run_id, ranks, done = job(client, front, tmp_path, ["many-metrics", "--epochs", str(epochs)])
    names = set(client.get_run(run_id).data.metrics)
    keras_names = set(ranks[0]["local"][0][0])  # what Keras logged at epoch end: 15 keys and their val_ twins
    assert len(keras_names) == 30
    assert len(names) <= 50 and front.over_limit == []  # within the budget: the front never said 400
    for key in keras_names:  # every Keras metric, every epoch, with the global value every rank saw
        assert history(client, run_id, key) == pytest.approx(dict(enumerate(ranks[0]["history"][key])), rel=1e-6)
    assert "dataset_size" in names  # the user's own name kept its place, before hvd-mlflow's extras
    held = over_budget_rows(front, run_id)
    assert held and not set(held) & names  # what did not fit is not in the run as a metric...
    for name, values in held.items():  # ...and every value of it is in the CSV
        if name.startswith("batch/"):
            assert sorted(values) == list(range(2, epochs * 6 + 1, 2)), name
        else:
            assert sorted(values) == list(range(epochs)), name
    assert all(n.startswith(("batch/", "learning_rate", "epoch_time_s", "samples_per_s")) or "_rank_" in n
               for n in held)  # fmt: skip
    assert done.output.count("metric names (AzureML's limit)") == 1
    report("azureml_metric_budget", names_in_run=len(names), limit=50, keras_names=len(keras_names),
           names_in_csv=len(held), values_in_csv=sum(len(v) for v in held.values()), rejected_by_front=0)  # fmt: skip


def test_the_user_s_own_names_during_and_after_fit_keep_the_run_within_50_names(tmp_path, client, front):
    """The budget case with the user's own mlflow.log_metric on rank 0: user_score at every epoch end (after
    hvd-mlflow's), then test_score, test_loss and test_auc after fit. Before, the run held 51 names and more (the
    budget had filled the 50 with hvd-mlflow's own before the user's names came)."""
    epochs = 3
    run_id, ranks, done = job(client, front, tmp_path, ["many-metrics", "--epochs", str(epochs), "--user-scores"])
    names = set(client.get_run(run_id).data.metrics)
    keras_names = set(ranks[0]["local"][0][0])
    assert len(names) <= 50 and front.over_limit == [], len(names)  # whoever logs, never past AzureML's 50
    assert keras_names <= names  # Keras' epoch metrics keep their places
    for key in keras_names:
        assert history(client, run_id, key) == pytest.approx(dict(enumerate(ranks[0]["history"][key])), rel=1e-6)
    # the user's names come before hvd-mlflow's optional ones: every value of each
    assert history(client, run_id, "user_score") == {e: 100.0 + e for e in range(epochs)}
    assert {k: history(client, run_id, k) for k in ("test_score", "test_loss", "test_auc")} == {
        "test_score": {0: 0.75},
        "test_loss": {0: 0.5},
        "test_auc": {0: 0.8},
    }
    held = over_budget_rows(front, run_id)  # hvd-mlflow's optional names that did not fit, every value
    assert held and not set(held) & names
    report("azureml_metric_budget_user_names", names_in_run=len(names), limit=50, names_in_csv=len(held))


def test_a_resume_with_60_changed_params_keeps_within_50_tags(tmp_path, client, front):
    name = f"azureml-resume-{uuid.uuid4().hex[:8]}"
    experiment_id = client.create_experiment(name, artifact_location=front.artifact_location(name))
    run_id = client.create_run(experiment_id).info.run_id
    run_id, _, _ = job(client, front, tmp_path / "first", ["plain", "--epochs", "2", "--params", "60",
                       "--param-value", "old"], run_id=run_id)  # fmt: skip
    run_id, _, done = job(client, front, tmp_path / "again", ["plain", "--epochs", "2", "--params", "60",
                          "--param-value", "new"], run_id=run_id)  # fmt: skip
    run = client.get_run(run_id)
    assert len(run.data.tags) <= 50 and not [k for k in run.data.tags if k.startswith("param_changed")]
    assert all(run.data.params[f"p_{i:03d}"] == "old" for i in range(60))  # MLflow keeps the first values
    [changes] = list((front.artifact_dir / f"dcid.{run_id}" / "hvd_mlflow").glob("param-changes-*.json"))
    changed = json.loads(changes.read_text())
    assert {k: v for k, v in changed.items() if k.startswith("p_")} == {
        f"p_{i:03d}": {"logged": "old", "now": "new"} for i in range(60)
    }
    assert front.over_limit == []
    report("azureml_param_changes", tags_in_run=len(run.data.tags), tag_limit=50, changes_in_artifact=len(changed))


def test_a_refused_metric_name_costs_only_that_name(mlflow_server, tmp_path, client):
    epochs = 4
    with AzureMLFront(mlflow_server.url, tmp_path / "tls", refuse_metric_names=("val_accuracy",)) as front:
        run_id, ranks, done = job(client, front, tmp_path, ["plain", "--epochs", str(epochs)])
    assert front.over_limit  # the front did refuse it
    assert "val_accuracy" not in client.get_run(run_id).data.metrics
    present = 0
    for key in ("loss", "accuracy", "val_loss"):
        got = history(client, run_id, key)
        assert sorted(got) == list(range(epochs)), key
        want = [float(np.mean([r["local"][0][e][key] for r in ranks])) for e in range(epochs)]
        assert [got[e] for e in range(epochs)] == pytest.approx(want, rel=1e-6)
        present += len(got)
    assert set(over_budget_rows(front, run_id)["val_accuracy"]) == set(range(epochs))  # kept, not lost
    assert done.output.count("refused metric 'val_accuracy'") == 1
    report("azureml_refused_name", points_present=present, points_expected=3 * epochs, refused="val_accuracy")


def test_a_per_batch_plan_over_the_row_limit_raises_the_interval(mlflow_server, tmp_path, client):
    # 4 epochs x 6 batches every step would be 24 rows of each batch/ curve; the front keeps 10
    with AzureMLFront(mlflow_server.url, tmp_path / "tls", max_rows_per_metric=10) as front:
        run_id, _, done = job(client, front, tmp_path, ["plain", "--epochs", "4"], HVD_MLFLOW_LOG_EVERY_N_STEPS="1",
                              HVD_MLFLOW_MAX_ROWS_PER_METRIC="10")  # fmt: skip
    assert "logging every 3 steps instead" in done.output
    steps = sorted(history(client, run_id, "batch/loss"))
    assert steps == [3, 6, 9, 12, 15, 18, 21, 24] and len(steps) <= 10
    assert front.over_limit == []
    report("azureml_row_limit", rows=len(steps), limit=10, interval=3)


@pytest.mark.faults
def test_a_429_storm_over_most_of_the_training(mlflow_server, tmp_path, client):
    """Every request answered 429 (Retry-After: 2) for 8 s of a ~12 s training: no epoch end on rank 0 waits
    on the server (its time besides the collective's wait for the other rank stays under 1 s), and afterwards
    every point is there exactly once; the job's run stays RUNNING."""
    epochs = 10
    storm_s = 8.0  # several Retry-After answers, over most of the 10 epochs of 1.2 s
    with AzureMLFront(mlflow_server.url, tmp_path / "tls") as front:
        started = {"done": False}

        def start_storm_at_the_first_metrics(request):
            if not started["done"] and request.metrics:
                started["done"] = True
                front.storm(storm_s, retry_after=2)
            return None

        front.fault = start_storm_at_the_first_metrics
        run_id, ranks, done = job(client, front, tmp_path, ["plain", "--epochs", str(epochs), "--epoch-sleep",
                                  "1.2"])  # fmt: skip
    assert front.storm_answers >= 2
    present = 0
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        got = history(client, run_id, key)
        assert sorted(got) == list(range(epochs)), key
        want = [float(np.mean([r["local"][0][e][key] for r in ranks])) for e in range(epochs)]
        assert [got[e] for e in range(epochs)] == pytest.approx(want, rel=1e-6)
        present += len(got)
    # what rank 0's epoch ends spent besides waiting in the collective for rank 1: hvd-mlflow's own stall
    stall = max(end - wait for end, wait in zip(ranks[0]["epoch_end_s"], ranks[0]["collective_s"], strict=True))
    assert stall < 1.0, (ranks[0]["epoch_end_s"], ranks[0]["collective_s"])
    assert client.get_run(run_id).info.status == "RUNNING"
    report("azureml_429_storm", answered_429=front.storm_answers, storm_s=storm_s,
           longest_rank0_stall_s=round(stall, 3),
           longest_collective_wait_s=round(max(ranks[0]["collective_s"]), 3),
           points_present=present, points_expected=4 * epochs)  # fmt: skip
