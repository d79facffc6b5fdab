"""MLflow's own TensorFlow autologging is off wherever ``hvd_mlflow.autolog()`` is on, whatever ``guard_other_ranks``
says: it logs each process's local values into the same run (in a job: ``MLFLOW_RUN_ID``), a second point per metric
per epoch beside hvd-mlflow's global one. Before, only the guard of other ranks' writes turned it off, so with
``guard_other_ranks=False`` every rank's MLflow autologging wrote into the job's run.

The truth: Keras' own History, and the points in the job's run on the real ``mlflow server``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.support.environment import clean_environment

pytestmark = [pytest.mark.once, pytest.mark.timeout(300)]  # the guard's code: the same in every flavour
EPOCHS = 3

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import mlflow.tensorflow
    import tensorflow as tf
    import hvd_mlflow

    mlflow.tensorflow.autolog()  # as many scripts do, before anything else
    hvd_mlflow.autolog(guard_other_ranks=sys.argv[1] == "on", log_models=False)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=EPOCHS, verbose=0)
    print("RESULT " + json.dumps([float(v) for v in history.history["loss"]]))
    """
).replace("EPOCHS", str(EPOCHS))


@pytest.mark.parametrize("guard", ["on", "off"])
def test_mlflow_s_tensorflow_autologging_is_off_whatever_guard_other_ranks_says(guard, tmp_path, mlflow_server,
                                                                                 client):  # fmt: skip
    run_id = client.create_run("0").info.run_id
    env = clean_environment(MLFLOW_TRACKING_URI=mlflow_server.url, MLFLOW_RUN_ID=run_id, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", SCRIPT, guard], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    [line] = [li for li in done.stdout.splitlines() if li.startswith("RESULT ")]
    losses = json.loads(line.removeprefix("RESULT "))
    points = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
    assert points == [(e, pytest.approx(v, rel=1e-6)) for e, v in enumerate(losses)]  # hvd-mlflow's alone, once
    assert "mlflow.tensorflow.autolog() is turned off while hvd_mlflow.autolog() is on" in done.stderr
    run = client.get_run(run_id)
    assert "opt_name" not in run.data.params and "epochs" in run.data.params  # hvd-mlflow's params, not MLflow's
