"""Every epoch of every fit, once, under tf.distribute: the recipes users run in an AzureML ``type: tensorflow`` job
(the job's run in ``MLFLOW_RUN_ID`` on every worker).

* Keras' transfer-learning recipe: a second ``fit`` after ``compile`` again, without ``initial_epoch``: its epochs
  follow the first fit's in the job's run (before hvd-mlflow moved later fits, they were dropped as already logged);
* a job restarted by ``keras.callbacks.BackupAndRestore``: the first attempt stops after epoch 2 was logged but
  before its backup was written, the second attempt trains epoch 2 again and goes on: each epoch is in the run once
  (``resume="skip"``: the restarted process does not log what the run holds already).
Values are the ones Keras' later callbacks saw (hvd-mlflow's written-back global values).
"""

from __future__ import annotations

import uuid

import pytest

from tests.support import tf_workers
from tests.support.checks import report

pytestmark = [pytest.mark.tfdistribute, pytest.mark.timeout(900)]
STEPS, EVERY = 6, 2


def job_run(client) -> str:
    return client.create_run(client.create_experiment(f"tfd-later-{uuid.uuid4().hex[:8]}")).info.run_id


def values(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_transfer_recipe_second_fit_follows_the_first_in_the_job_s_run(tmp_path, mlflow_server, client):
    run_id = job_run(client)
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_RUN_ID": run_id}
    args = ["--scenarios", "classification", "--epochs", "3", "--transfer-recipe", "2",
            "--autolog-options", f'{{"log_every_n_steps": {EVERY}}}']  # fmt: skip
    done = tf_workers.run(tmp_path, args, env=env, timeout=600).check()
    ranks = [done.rank(r)["scenarios"]["classification"] for r in (0, 1)]
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        want = ranks[0]["history"][key] + ranks[0]["history_second_fit"][key]
        points = values(client, run_id, key)
        assert [s for s, _ in points] == list(range(5)), key  # both fits, each epoch once, in order
        assert [v for _, v in points] == pytest.approx(want, rel=1e-6), key
        assert ranks[1]["history"][key] + ranks[1]["history_second_fit"][key] == pytest.approx(want, rel=1e-6)
    assert [s for s, _ in values(client, run_id, "batch/loss")] == list(range(EVERY, 5 * STEPS + 1, EVERY))
    assert client.get_run(run_id).data.tags["hvd_mlflow.fit_starts"] == "0,3"
    report("tf.distribute later fit", steps=list(range(5)))


def test_backup_and_restore_restart_logs_each_epoch_once(tmp_path, mlflow_server, client):
    run_id = job_run(client)
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_RUN_ID": run_id}
    backup = tmp_path / "backup"
    args = ["--scenarios", "classification", "--epochs", "4", "--backup", str(backup)]
    first = tf_workers.run(tmp_path / "a", [*args, "--interrupt-after-epoch", "2"], env=env, timeout=600).check()
    second = tf_workers.run(tmp_path / "b", args, env=env, timeout=600).check()
    a = first.rank(0)["scenarios"]["classification"]["seen"]  # epochs 0-2, as the first attempt's callbacks saw them
    b = second.rank(0)["scenarios"]["classification"]
    assert len(a) == 3 and len(b["seen"]) == 2  # the restart trained epochs 2 and 3 (BackupAndRestore: from epoch 2)
    for key in ("loss", "accuracy", "val_loss", "auc"):
        points = values(client, run_id, key)
        assert [s for s, _ in points] == [0, 1, 2, 3], key  # each epoch once: the repeated epoch 2 is not logged again
        want = [e[key] for e in a] + [b["seen"][1][key]]  # 0-2: the first attempt's values; 3: the restart's
        assert [v for _, v in points] == pytest.approx(want, rel=1e-6), key
    assert "hvd_mlflow.fit_starts" not in client.get_run(run_id).data.tags  # one fit per process: nothing moved
    report("tf.distribute BackupAndRestore", steps=[0, 1, 2, 3])
