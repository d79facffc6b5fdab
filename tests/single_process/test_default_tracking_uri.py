"""The quickstart's path: no ``MLFLOW_TRACKING_URI``, a script that never imports MLflow. MLflow's default store gets
the run, and MLflow is not imported on the training thread at train begin (where every rank would wait for it in the
train-begin agreement): the sender imports it, off that thread, once the first epoch has ended."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.support.checks import sync
from tests.support.environment import clean_environment

pytestmark = pytest.mark.timeout(300)

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys
    import numpy as np
    import tensorflow as tf
    import hvd_mlflow

    hvd_mlflow.autolog(log_models=False)
    seen = {}
    if "--kill" in sys.argv:  # the premise: the sender has not begun when the first epoch ends, however long that
        # epoch takes (under CI's load it took more than START_AFTER_S: the sender began by itself, imported MLflow
        # and was creating the default store's tables when the kill came, which left them half made)
        from hvd_mlflow.delivery import sender

        sender.START_AFTER_S = 3600.0

    class Probe(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # after hvd-mlflow's train begin (its callback comes first)
            seen["mlflow_at_train_begin"] = "mlflow" in sys.modules

        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 0:
                seen["mlflow_at_first_epoch_begin"] = "mlflow" in sys.modules

        def on_epoch_end(self, epoch, logs=None):
            if "--kill" in sys.argv:  # killed at once: the sender had no time to import MLflow and resolve the URI
                print("RESULT " + json.dumps({"loss": float(logs["loss"])}), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=3, callbacks=[Probe()], verbose=0)
    seen["loss"] = [float(v) for v in history.history["loss"]]
    seen["default_uri"] = __import__("mlflow").get_tracking_uri()
    print("RESULT " + json.dumps(seen))
    """
)


def test_without_a_tracking_uri_the_run_is_in_mlflow_s_default_store_and_mlflow_is_not_imported_at_train_begin(
    tmp_path,
):
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=clean_environment(TF_CPP_MIN_LOG_LEVEL="2"),
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    [line] = [li for li in done.stdout.splitlines() if li.startswith("RESULT ")]
    seen = json.loads(line[len("RESULT ") :])
    assert seen["mlflow_at_train_begin"] is False and seen["mlflow_at_first_epoch_begin"] is False, seen
    from mlflow import MlflowClient

    uri = seen["default_uri"]  # MLflow's own default for that working directory (3.x: sqlite mlflow.db; 2.x: mlruns)
    assert str(tmp_path) in uri, uri
    client = MlflowClient(uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", runs
    loss = sorted(client.get_metric_history(runs[0].info.run_id, "loss"), key=lambda m: m.step)
    assert [m.step for m in loss] == [0, 1, 2]
    assert [m.value for m in loss] == pytest.approx(seen["loss"], rel=1e-6)
    assert "Traceback" not in done.stderr


@pytest.mark.default_store  # the other test checks every flavour's train begin (no MLflow import there): every row
def test_a_journal_left_before_the_default_was_resolved_syncs_into_the_training_s_default_store(tmp_path):
    """Killed right after its first epoch: the journal names no tracking URI yet, only the training's working
    directory; ``sync`` run from elsewhere delivers into MLflow's default store there, not into its own folder's."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-c", SCRIPT, "--kill"], cwd=work,
                          env=clean_environment(TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True, text=True,
                          timeout=240)  # fmt: skip
    assert done.returncode == -9, (done.stdout + done.stderr)[-4000:]
    loss = json.loads(next(li for li in done.stdout.splitlines() if li.startswith("RESULT "))[7:])["loss"]
    [journal] = list((work / ".hvd_mlflow" / "journal").glob("*.journal.sqlite"))
    synced = sync(elsewhere, str(journal))
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert not list(elsewhere.iterdir()), list(elsewhere.iterdir())  # nothing made where sync ran
    from mlflow import MlflowClient

    ask = [sys.executable, "-c", "import mlflow; print(mlflow.get_tracking_uri())"]  # MLflow's own default, there
    uri = subprocess.run(ask, cwd=work, env=clean_environment(), capture_output=True, text=True, check=True).stdout
    uri = uri.strip()
    client = MlflowClient(uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1, runs
    assert [(m.step, m.value) for m in client.get_metric_history(runs[0].info.run_id, "loss")] == [
        (0, pytest.approx(loss, rel=1e-6))
    ]
