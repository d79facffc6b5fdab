"""The training thread pays at most one fsync per epoch, batch curves and epoch 0's params and tags included: a
fit under ``strace`` counts the ``fsync``/``fdatasync`` calls of the main thread (where Keras runs the callbacks)
between the end of train begin and the end of the last epoch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

# once: the fsyncs are the journal's (one transaction per epoch), whichever Keras flavour calls the hooks; under strace
# this fit took 123 s in the tf_keras row and 17 s in the oldest, against 27 s in the newest where it still runs
pytestmark = [pytest.mark.timeout(300), pytest.mark.once,
              pytest.mark.skipif(not shutil.which("strace"), reason="needs strace")]  # fmt: skip

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import tensorflow as tf
    import hvd_mlflow

    keras = tf.keras
    hvd_mlflow.autolog(log_every_n_steps=1)

    class Marks(keras.callbacks.Callback):  # after hvd-mlflow's callback (autolog puts its own first)
        def on_train_begin(self, logs=None):
            os.access("/hvd-mlflow-mark/begin", os.F_OK)  # a syscall the trace finds: where the count begins
        def on_epoch_end(self, epoch, logs=None):
            if epoch == self.params["epochs"] - 1:
                os.access("/hvd-mlflow-mark/end", os.F_OK)  # where it ends

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    print("PID", os.getpid(), flush=True)
    model.fit(x, y, batch_size=8, epochs=int(sys.argv[1]), callbacks=[Marks()], verbose=0)
    """
)


def test_one_fsync_per_epoch_on_the_training_thread(tmp_path, mlflow_server, client):
    epochs, batches = 3, 8
    name = f"fsyncs-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    trace = tmp_path / "trace.txt"
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_EXPERIMENT_NAME": name,
           "HVD_MLFLOW_JOURNAL_DIR": str(tmp_path / "journal"), "TF_CPP_MIN_LOG_LEVEL": "2"}  # fmt: skip
    env.pop("MLFLOW_RUN_ID", None)
    done = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync,access", "-o", str(trace), sys.executable,
         str(script), str(epochs)], env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    main = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("PID "))
    calls = [line.split(None, 1)[1] for line in trace.read_text().splitlines() if line.split(None, 1)[0] == main]
    begin = next(i for i, call in enumerate(calls) if "/hvd-mlflow-mark/begin" in call)
    end = next(i for i, call in enumerate(calls) if "/hvd-mlflow-mark/end" in call)
    between = [call for call in calls[begin + 1 : end] if call.startswith(("fsync(", "fdatasync("))]
    [run] = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    # what the count covers was journaled: every batch point, every epoch, the params
    assert len(client.get_metric_history(run.info.run_id, "batch/loss")) == epochs * batches
    assert len(client.get_metric_history(run.info.run_id, "loss")) == epochs and run.data.params
    assert len(between) <= epochs, between
