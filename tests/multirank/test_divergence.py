"""Ranks that train different models are found in the epoch's own collective; per-rank health rides in it too."""

from __future__ import annotations

import pytest

from tests.support import launch
from tests.support.checks import report

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

WORKER = launch.WORKER.parent / "health_worker.py"
EPOCHS = 3
SAID = "the ranks hold different weights at epoch"


def keras3() -> bool:
    """Whether the training here is Keras 3 (TF 2.16 without TF_USE_LEGACY_KERAS), not tf_keras nor Keras 2."""
    import keras
    import tensorflow as tf

    return tf.keras.Model.__module__.startswith("keras") and keras.__version__.startswith("3")


@pytest.fixture(scope="module")
def health(tmp_path_factory, mlflow_server):
    """One job, three fits: ranks that train different models (Keras 3: Horovod's DistributedOptimizer, which does
    not average there; tf_keras / Keras 2: no broadcast of the initial weights), one model on every rank, and one
    model with system metrics while rank 1 burns CPU."""
    out = tmp_path_factory.mktemp("health")
    diverged = "horovod-optimizer" if keras3() else "no-broadcast"
    experiment = f"health-{out.name}"
    done = launch.run(out, ["--scenarios", f"{diverged},averaged,busy-rank-1", "--epochs", str(EPOCHS)],
                      worker=WORKER, env={"MLFLOW_TRACKING_URI": mlflow_server.url,
                                          "MLFLOW_EXPERIMENT_NAME": experiment}).check()  # fmt: skip
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server.url)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    runs = {r.data.tags["scenario"]: r for r in client.search_runs([experiment_id])}
    return diverged, runs, [done.rank(0), done.rank(1)], done


def test_ranks_that_train_different_models_are_found_at_epoch_0(health, client):
    scenario, runs, ranks, done = health
    fits = [r["fits"][scenario] for r in ranks]
    assert fits[0]["weights"] != fits[1]["weights"]  # they really differ (the truth, without hvd-mlflow)
    assert done.output.count(SAID) == 2  # every rank, once; and only for this fit
    assert f"{SAID} 0 " in done.output
    run_id = runs[scenario].info.run_id
    assert runs[scenario].data.tags["hvd_mlflow.diverged_at_epoch"] == "0"
    spread = sorted(client.get_metric_history(run_id, "weights_rank_spread"), key=lambda m: m.step)
    assert [m.step for m in spread] == list(range(EPOCHS)) and all(m.value > 1e-5 for m in spread)
    report(f"divergence_{scenario}", first_epoch=0, spreads=[round(m.value, 6) for m in spread])


def test_one_model_on_every_rank_is_not_warned_about(health):
    _, runs, ranks, _ = health
    fits = [r["fits"]["averaged"] for r in ranks]
    flat = [[w for layer in f["weights"] for w in layer] for f in fits]
    assert flat[0] == pytest.approx(flat[1], abs=1e-6)  # one model (the truth, without hvd-mlflow)
    run = runs["averaged"]
    assert "hvd_mlflow.diverged_at_epoch" not in run.data.tags and "weights_rank_spread" not in run.data.metrics


def test_per_rank_health_names_the_busy_rank_without_any_extra_collective(health, client):
    _, runs, ranks, _ = health
    run_id = runs["busy-rank-1"].info.run_id
    for key in ("system/cpu_percent_max_rank", "system/cpu_percent_max", "system/rss_mb_mean"):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == list(range(EPOCHS)), key
    busiest = [m.value for m in client.get_metric_history(run_id, "system/cpu_percent_max_rank")]
    assert busiest == [1.0] * EPOCHS  # rank 1 burns a core in a thread
    cpu_min = {m.step: m.value for m in client.get_metric_history(run_id, "system/cpu_percent_min")}
    cpu_max = {m.step: m.value for m in client.get_metric_history(run_id, "system/cpu_percent_max")}
    assert all(cpu_max[e] > cpu_min[e] + 30 for e in range(EPOCHS)), (cpu_min, cpu_max)
    # the same collectives as without it: one agreement at train begin, then one per epoch (an allgather here)
    for rank in ranks:
        assert rank["fits"]["busy-rank-1"]["collectives"] == {"allgather_object": 1, "allgather": EPOCHS}
        assert rank["fits"]["averaged"]["collectives"] == {"allgather_object": 1, "allreduce_sum": EPOCHS}
    report("system_metrics", busiest_rank=busiest, cpu_max=list(cpu_max.values()), cpu_min=list(cpu_min.values()))
