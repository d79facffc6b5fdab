"""One rank's empty shard (training or validation) stops every rank alike, at train begin: the same error on
every rank, nothing hangs, nothing is logged but a FAILED run. Real horovodrun ranks, a real server."""

from __future__ import annotations

import uuid

import pytest

from tests.support import launch
from tests.support.checks import report

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(400)]

WORKER = launch.WORKER.parent / "user_script_worker.py"


@pytest.mark.parametrize("empty", ["validation", "training"])
def test_an_empty_shard_on_rank_1_stops_every_rank_alike(tmp_path, mlflow_server, client, empty):
    name = f"empty-{empty}-{uuid.uuid4().hex[:8]}"
    done = launch.run(tmp_path, ["empty-shard", "--empty", empty], worker=WORKER, timeout=150,
                      env={"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_EXPERIMENT_NAME": name})  # fmt: skip
    assert done.returncode == 0, f"exit {done.returncode} after {done.seconds:.0f} s:\n{done.output[-6000:]}"
    ranks = [done.rank(0), done.rank(1)]
    errors = [r["error"] for r in ranks]
    assert errors[0] == errors[1], errors  # the same error, word for word, on every rank
    kind, message = errors[0]
    assert kind == "hvd_mlflow.errors.EmptyShardError", errors[0]
    assert f"rank 1: {empty}" in message and "rank 0" not in message, message
    assert all("seen" not in r and not any(r.get("local", [])) for r in ranks)  # stopped before the first epoch
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    assert all(r.info.status == "FAILED" and not r.data.metrics for r in runs), runs
    report(f"empty_{empty}_shard", seconds=round(done.seconds, 1), error=message.splitlines()[0])
