"""The chief's tracking server down for the whole run under tf.distribute (nothing listens at its address, MLflow's own
retries at their defaults): the training is not held up, the end of the chief's ``fit`` is bounded by the sender's
grace (the address refuses connections: known at once), every epoch is in the chief's journal, and once the server
is back at that address ``hvd-mlflow sync`` delivers each epoch exactly once, with the values Keras' callbacks saw."""

from __future__ import annotations

import uuid

import pytest

from hvd_mlflow.delivery.sender import DOWN_GRACE_S
from tests.support import tf_workers
from tests.support.checks import journals, report, sync
from tests.support.mlflow_server import free_port
from tests.support.proxy import Proxy

pytestmark = [pytest.mark.tfdistribute, pytest.mark.timeout(600)]
EPOCHS = 4


def test_a_server_down_for_the_whole_run_costs_the_chief_seconds_and_sync_delivers_every_epoch_once(
    tmp_path, mlflow_server, client
):
    port, name = free_port(), f"tfd-down-{uuid.uuid4().hex[:8]}"
    env = {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}", "MLFLOW_EXPERIMENT_NAME": name}
    done = tf_workers.run(tmp_path, ["--scenarios", "classification", "--epochs", str(EPOCHS)], env=env,
                          timeout=400).check()  # fmt: skip
    ranks = [done.rank(0)["scenarios"]["classification"], done.rank(1)["scenarios"]["classification"]]
    chief_later_s = ranks[0]["fit_returned_at"] - ranks[1]["fit_returned_at"]
    end_fit_s = [r["end_fit_s"] for r in ranks]  # hvd-mlflow's own end of fit, timed inside each worker
    # the chief waits the sender's grace once (the address refuses connections: known at once), not 6 s + 3 s, not
    # flush_timeout (60 s); worker 1 keeps nothing and never waits. The fits' return times differ by more than that:
    # TF's own end of fit (after Keras' train-end callbacks) took 0-12 s more on the chief under a busy CPU, measured
    assert end_fit_s[0] < DOWN_GRACE_S + 0.5 and end_fit_s[1] < 0.5, end_fit_s
    assert "hvd-mlflow sync" in done.output and "(the server does not answer)" in done.output, done.output[-3000:]
    [journal] = journals(tmp_path)  # the chief's, on its disk; worker 1 keeps none
    with Proxy(mlflow_server.url, port=port):  # the server is back at the same address: the command the warning gave
        synced = sync(tmp_path)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    [run] = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    history = ranks[0]["history"]
    for key in ("loss", "accuracy", "auc", "val_loss"):
        points = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert [s for s, _ in points] == list(range(EPOCHS)), (key, points)  # every epoch, once
        assert [v for _, v in points] == pytest.approx(history[key], rel=1e-6), key  # what Keras' callbacks saw
    assert run.info.status == "FINISHED" and run.data.tags["hvd_mlflow.engine"] == "tf.distribute"
    assert journals(tmp_path) == []
    report("tfd_server_down_whole_run", chief_fit_later_s=round(chief_later_s, 2), seconds=round(done.seconds, 1),
           fit_s=[round(r["fit_s"], 2) for r in ranks], end_fit_s=[round(s, 2) for s in end_fit_s],
           train_end_later_s=round(ranks[0]["train_end_began_at"] - ranks[1]["train_end_began_at"], 2))  # fmt: skip
