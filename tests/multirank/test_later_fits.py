"""A second ``fit`` in the same job keeps its epochs: Keras' transfer-learning recipe on 2 real Horovod ranks.

keras-io's guides/transfer_learning.py trains a new head with the base frozen, then unfreezes the base, compiles
again with a low learning rate and calls ``fit`` again without ``initial_epoch``. In an AzureML-style job (the run in
``MLFLOW_RUN_ID`` on every rank) both fits log into the job's run: the second fit's epochs follow the first's (steps
3 and 4 after 0, 1, 2), its batch curve follows the first's too (the new optimizer counts from 0 again), and every
value is the one Keras' later callbacks saw on every rank (the written-back global value). Before hvd-mlflow moved
later fits, the second fit's epochs were dropped as already logged (resume="skip"): the run held steps 0-2 only.
"""

from __future__ import annotations

import pytest

from tests.support import launch
from tests.support.checks import report

# every Horovod row: the recipe runs where users run it (Keras 3, tf_keras, Keras 2)
pytestmark = [pytest.mark.multirank, pytest.mark.shared, pytest.mark.oldest, pytest.mark.timeout(600)]

FIRST, SECOND, STEPS, EVERY = 3, 2, 6, 2  # epochs of each fit; 96 samples in batches of 16; batch/ every 2 steps


def test_transfer_learning_recipe_logs_both_fits_in_order_in_the_job_s_run(tmp_path, mlflow_server, client):
    run_id = client.create_run("0").info.run_id  # the job's run, made before the job (as AzureML's control plane)
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_RUN_ID": run_id}
    args = ["--epochs", str(FIRST), "--transfer-recipe", str(SECOND), "--log-every-n-steps", str(EVERY)]
    done = launch.run(tmp_path, args, env=env).check()
    ranks = [done.rank(0), done.rank(1)]
    epochs = FIRST + SECOND
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        points = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [p.step for p in points] == list(range(epochs)), key  # every epoch of both fits, once, in order
        want = ranks[0]["history"][key] + ranks[0]["history_second_fit"][key]  # Keras' written-back values
        assert [p.value for p in points] == pytest.approx(want, rel=1e-6), key
        for other in ranks[1:]:  # the values every rank's later callbacks saw
            assert other["history"][key] + other["history_second_fit"][key] == pytest.approx(want, rel=1e-6), key
    assert ranks[0]["history_second_fit"]["loss"] != ranks[0]["history"]["loss"][:SECOND]  # a new phase, new values
    batch_steps = [p.step for p in client.get_metric_history(run_id, "batch/loss")]
    assert sorted(batch_steps) == list(range(EVERY, epochs * STEPS + 1, EVERY))  # the second fit's follow the first's
    run = client.get_run(run_id)
    assert run.data.tags["hvd_mlflow.fit_starts"] == f"0,{FIRST}"  # where each fit began
    assert run.data.params["epochs"] == str(FIRST)  # the first fit's; the second's changed values are in an artifact
    assert "epochs: '3' -> '2'" in done.output
    assert "already holds" not in done.output  # nothing was skipped as already logged
    assert run.info.status == "RUNNING"  # the job's run: not ours to end
    report("later fits", steps=list(range(epochs)), batch_points=len(batch_steps), flavour=ranks[0]["flavour"])
