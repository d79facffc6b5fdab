"""One process on Keras 3's JAX backend, no TensorFlow installed (the JAX row): hvd-mlflow logs as it does on
TensorFlow. Before hvd-mlflow ran without TensorFlow, ``autolog()`` stopped with ``MissingDependencyError``.

The job's run (``MLFLOW_RUN_ID``) gets one point per metric per epoch, each Keras' own value (History), and
hvd-mlflow's per-epoch extras (``samples_per_s`` from Keras' own sample count); the params and tags as on TensorFlow;
TensorFlow is never imported. With the server down for the whole fit, the journal keeps every epoch and
``hvd-mlflow sync`` delivers each point once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.environment import clean_environment

pytestmark = [pytest.mark.jax, pytest.mark.alone, pytest.mark.timeout(300)]  # alone: the row's one phase (test.sh)
BIN = Path(sys.executable).parent
EPOCHS, SAMPLES = 3, 48

SCRIPT = """
import json, os, sys
os.environ["KERAS_BACKEND"] = "jax"
import numpy as np, keras
import hvd_mlflow

hvd_mlflow.autolog()
rng = np.random.default_rng(0)
x = rng.normal(size=(%(samples)d, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("float32")[:, None]
model = keras.Sequential([keras.Input(shape=(8,)), keras.layers.Dense(4, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy",
              metrics=["accuracy", keras.metrics.AUC(name="auc")])
history = model.fit(x, y, batch_size=16, epochs=%(epochs)d, validation_data=(x[:24], y[:24]), verbose=0)
print(json.dumps({"history": history.history, "tensorflow": "tensorflow" in sys.modules,
                  "backend": keras.backend.backend(), "predicted": model.predict(x[:4], verbose=0).tolist(),
                  "x4": x[:4].tolist()}))
"""


def train(tmp_path: Path, **env: str) -> dict:
    environment = clean_environment(**{"HVD_MLFLOW_TESTING": "1", "HVD_MLFLOW_LOG_MODELS": "0", "PYTHONUNBUFFERED": "1",
                                       **env})  # fmt: skip
    done = subprocess.run([sys.executable, "-c", SCRIPT % {"samples": SAMPLES, "epochs": EPOCHS}], cwd=tmp_path,
                          env=environment, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["stderr"] = done.stderr
    return out


def test_one_process_on_jax_logs_into_the_job_s_run_as_on_tensorflow(tmp_path, mlflow_server, client):
    """Every History value once per epoch, the per-epoch extras, params and tags; and with log_models on, the model
    as an MLflow model of MLflow's keras flavour (Keras' own .keras file), linked to the run, which loads and predicts
    what the trained model predicted. Before, the save went through mlflow.tensorflow and failed: no TensorFlow."""
    import mlflow

    run_id = client.create_run("0").info.run_id
    out = train(tmp_path, MLFLOW_TRACKING_URI=mlflow_server.url, MLFLOW_RUN_ID=run_id, HVD_MLFLOW_LOG_MODELS="1",
                HVD_MLFLOW_FLUSH_TIMEOUT="60")  # fmt: skip
    assert out["backend"] == "jax" and out["tensorflow"] is False  # nothing of TensorFlow was imported
    history = out["history"]
    for key, values in history.items():
        points = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        assert [s for s, _ in points] == list(range(EPOCHS)), (key, out["stderr"][-3000:])  # one point per epoch
        assert [v for _, v in points] == pytest.approx(values, rel=1e-6), key  # Keras' own value
    for step in range(EPOCHS):
        [samples] = [m.value for m in client.get_metric_history(run_id, "samples_per_s") if m.step == step]
        [seconds] = [m.value for m in client.get_metric_history(run_id, "epoch_time_s") if m.step == step]
        assert samples * seconds == pytest.approx(SAMPLES, rel=1e-6)  # Keras' own count of training samples
    run = client.get_run(run_id)
    assert run.data.params["batch_size"] == "16" and run.data.params["epochs"] == str(EPOCHS)
    assert run.data.tags["hvd_mlflow.engine"] == "single process" and run.data.tags["hvd_mlflow.world_size"] == "1"
    assert run.info.status == "RUNNING"  # the job's run: not ours to end
    [logged] = client.search_logged_models(experiment_ids=["0"], filter_string=f"source_run_id = '{run_id}'")
    assert str(logged.status).endswith("READY"), logged.status
    mlflow.set_tracking_uri(mlflow_server.url)
    model = mlflow.keras.load_model(f"models:/{logged.model_id}")
    predicted = model.predict(np.asarray(out["x4"], dtype="float32"), verbose=0).reshape(-1)
    assert predicted.tolist() == pytest.approx(np.asarray(out["predicted"]).reshape(-1).tolist(), rel=1e-6)
    assert set(mlflow.models.get_model_info(f"models:/{logged.model_id}").flavors) == {"keras", "python_function"}


def test_the_journal_keeps_what_a_dead_server_missed_and_sync_delivers_it_once(tmp_path, mlflow_server, client):
    run_id = client.create_run("0").info.run_id
    journal = tmp_path / "journal"
    out = train(tmp_path, MLFLOW_TRACKING_URI="http://127.0.0.1:9", MLFLOW_RUN_ID=run_id,
                HVD_MLFLOW_JOURNAL_DIR=str(journal), HVD_MLFLOW_FLUSH_TIMEOUT="5")  # fmt: skip
    assert "hvd-mlflow sync" in out["stderr"]
    [path] = list(journal.glob("*.journal.sqlite"))
    sync = subprocess.run([str(BIN / "hvd-mlflow"), "sync", str(path), "--tracking-uri", mlflow_server.url],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert sync.returncode == 0 and "Traceback" not in sync.stderr, sync.stdout + sync.stderr
    assert not path.exists()  # delivered whole: the journal is gone
    for key, values in out["history"].items():
        points = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        assert points == [(s, pytest.approx(v, rel=1e-6)) for s, v in enumerate(values)], key
