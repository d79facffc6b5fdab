"""One writer under tf.distribute, as an AzureML ``distribution: type: tensorflow`` job runs: every worker inherits
the job's ``MLFLOW_RUN_ID``; the chief alone talks to the tracking server and keeps a journal.

Each worker is pointed at a counting proxy of its own, so every request shows whose it is; each keeps its journal
folder apart. The user's own ``mlflow.log_param`` / ``log_metric`` run on every worker (AzureML's examples make such
calls). Checked against independent values: the points per (metric, epoch) in the job's run, the rank spread against
each worker's own loss (plain Keras on its shard), the requests by worker. Both cluster layouts: workers only (worker 0
is the chief) and a ``chief`` task beside a worker.
"""

from __future__ import annotations

import uuid

import pytest

from tests.support import tf_workers
from tests.support.checks import report
from tests.support.proxy import Proxy

pytestmark = [pytest.mark.tfdistribute, pytest.mark.timeout(600)]
EPOCHS = 2


@pytest.fixture(scope="module", params=["workers", "chief"])
def job(request, tmp_path_factory, mlflow_server):
    from mlflow import MlflowClient

    layout, client = request.param, MlflowClient(mlflow_server.url)
    out = tmp_path_factory.mktemp(f"tfd-job-{layout}")
    run_id = client.create_run(client.create_experiment(f"tfd-job-{uuid.uuid4().hex[:8]}")).info.run_id
    proxies = [Proxy(mlflow_server.url).__enter__() for _ in range(2)]
    try:
        env = {"MLFLOW_RUN_ID": run_id, "HVD_MLFLOW_SYSTEM_METRICS": "1", "HVD_MLFLOW_RANK_SPREAD": "loss"}
        per_worker = lambda rank: {"MLFLOW_TRACKING_URI": proxies[rank].url,  # noqa: E731
                                   "HVD_MLFLOW_JOURNAL_DIR": str(out / f"journal-{rank}")}  # fmt: skip
        args = ["--scenarios", "classification", "--lr0", "--epochs", str(EPOCHS), "--user-mlflow"]
        done = tf_workers.run(out, args, chief=layout == "chief", env=env, per_worker_env=per_worker,
                              timeout=400).check()  # fmt: skip
        requests = [list(p.requests) for p in proxies]
    finally:
        for proxy in proxies:
            proxy.__exit__(None, None, None)
    return layout, out, run_id, [done.rank(0), done.rank(1)], requests, done.output


def test_the_chief_alone_writes_one_point_per_epoch_into_the_job_s_run(job, client):
    layout, out, run_id, ranks, requests, output = job
    assert ranks[0]["task"] == (["chief", 0] if layout == "chief" else ["worker", 0])  # rank 0 is the chief
    assert requests[1] == []  # worker 1 never sent a request: no client, no run, no journal upload
    assert any(r.is_log_batch for r in requests[0]), requests[0][:5]
    run = client.get_run(run_id)
    history = ranks[0]["scenarios"]["classification"]["history"]
    points = 0
    for key in [*history, "epoch_time_s", "samples_per_s", "learning_rate"]:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert sorted(steps) == list(range(EPOCHS)), (key, steps)  # one point per epoch, never one per worker
        points += len(steps)
    assert [m.value for m in client.get_metric_history(run_id, "user_metric")] == [10.0]  # the chief's own call
    assert run.data.params["user_param"] == "from every worker" and run.data.params["world_size"] == "2"
    assert run.data.tags["hvd_mlflow.engine"] == "tf.distribute"
    assert not (out / "journal-1").exists() or not list((out / "journal-1").iterdir())  # no journal on worker 1
    assert not list((out / "journal-0").glob("*.sqlite"))  # the chief's: delivered, removed
    assert ranks[0]["scenarios"]["classification"]["run_id"] == ranks[1]["scenarios"]["classification"]["run_id"]
    assert ranks[1]["scenarios"]["classification"]["run_id"] == run_id  # known on every worker at train begin
    # hvd-mlflow's own eager strategy.run (a few ms per epoch, until its functions are compiled) is not the user's
    # to hear about: TensorFlow's "Using CollectiveAllReduceStrategy eagerly has significant overhead" stays quiet
    assert "eagerly has significant overhead" not in output, output[-3000:]
    report(f"tfd_one_writer_{layout}", requests_by_worker=[len(r) for r in requests], points=points,
           points_per_metric_epoch=1)  # fmt: skip


def test_the_rank_spread_and_system_metrics_are_every_worker_s(job, client):
    layout, out, run_id, ranks, _, _ = job
    own = [r["scenarios"]["classification"]["own_train"]["loss"] for r in ranks]
    for key, truth in (("loss_rank_min", min(own)), ("loss_rank_max", max(own))):
        values = [m.value for m in client.get_metric_history(run_id, key)]
        assert values == pytest.approx([truth] * EPOCHS, rel=1e-6), (key, values, own)
    cpu = {m.step: m.value for m in client.get_metric_history(run_id, "system/cpu_percent_max_rank")}
    assert sorted(cpu) == list(range(EPOCHS)) and set(cpu.values()) <= {0.0, 1.0}  # the rank of the busiest worker
    memory = [m.value for m in client.get_metric_history(run_id, "system/rss_mb_min")]
    assert len(memory) == EPOCHS and all(v > 50 for v in memory)  # every worker's process, a TensorFlow one
