"""One rank's empty shard (training or validation) stops every rank alike, at train begin: the same error on
every rank, nothing hangs, nothing is logged but a FAILED run. Real horovodrun ranks, a real server; one launch,
one fit per empty part (after the error the ranks are fine: the second fit runs and stops alike too)."""

from __future__ import annotations

import uuid

import pytest

from tests.support import launch
from tests.support.checks import report

pytestmark = [pytest.mark.multirank, pytest.mark.shared, pytest.mark.timeout(400)]

WORKER = launch.WORKER.parent / "user_script_worker.py"
PARTS = ("validation", "training")


def test_an_empty_shard_on_rank_1_stops_every_rank_alike(tmp_path, mlflow_server, client):
    name = f"empty-shards-{uuid.uuid4().hex[:8]}"
    done = launch.run(tmp_path, ["empty-shard", "--empty", ",".join(PARTS)], worker=WORKER, timeout=150,
                      env={"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_EXPERIMENT_NAME": name})  # fmt: skip
    assert done.returncode == 0, f"exit {done.returncode} after {done.seconds:.0f} s:\n{done.output[-6000:]}"
    ranks = [done.rank(0), done.rank(1)]
    assert all(r.get("finished") for r in ranks)
    for empty in PARTS:
        fits = [r["fits"][empty] for r in ranks]
        errors = [f["error"] for f in fits]
        assert errors[0] == errors[1], (empty, errors)  # the same error, word for word, on every rank
        kind, message = errors[0]
        assert kind == "hvd_mlflow.errors.EmptyShardError", errors[0]
        assert message.endswith(f"\n  rank 1: {empty} data is empty"), message
        assert all("seen" not in f for f in fits)  # no epoch ended on any rank
    assert all(not any(r.get("local", [])) for r in ranks)  # Keras ran no epoch anywhere
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    assert all(r.info.status == "FAILED" and not r.data.metrics for r in runs), runs
    seconds = {empty: [round(r["fits"][empty]["seconds"], 1) for r in ranks] for empty in PARTS}
    report("empty_shards", launch_seconds=round(done.seconds, 1), fit_seconds=seconds)


def test_ranks_with_different_training_steps_stop_alike_at_train_begin_saying_each_rank_s_steps(tmp_path):
    """Horovod averages the gradients at every step: 4 steps on rank 0 and 3 on rank 1 would leave rank 0 waiting in
    its fourth step's allreduce (the job hung or failed without a word, with or without hvd-mlflow)."""
    done = launch.run(tmp_path, ["empty-shard", "--empty", "steps"], worker=WORKER, timeout=150)
    assert done.returncode == 0, f"exit {done.returncode} after {done.seconds:.0f} s:\n{done.output[-6000:]}"
    fits = [done.rank(r)["fits"]["steps"] for r in (0, 1)]
    assert fits[0]["error"] == fits[1]["error"]  # the same error, word for word, on every rank
    kind, message = fits[0]["error"]
    assert kind == "hvd_mlflow.errors.ShardMismatchError"
    assert "\n" not in message and "(rank 0: 4, rank 1: 3)" in message and "steps_per_epoch" in message, message
    assert all("seen" not in f for f in fits)  # no epoch ended on any rank
    assert all(f["seconds"] < 30 for f in fits), fits  # at train begin, not after a stall
