"""The user's own metric names within a run's name limit (AzureML: 50; here ``max_metric_names``): a name that
would pass the limit is not logged as a metric, its values go to a CSV artifact of the run, with one warning."""

from __future__ import annotations

import csv
import uuid

import mlflow
import numpy as np
import pytest

import hvd_mlflow

pytestmark = pytest.mark.timeout(300)


def test_a_user_name_over_the_limit_goes_to_a_csv_and_the_run_keeps_its_limit(
    mlflow_server, client, monkeypatch, tmp_path, caplog
):
    import tensorflow as tf

    keras = tf.keras
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HVD_MLFLOW_JOURNAL_DIR", str(tmp_path / "journal"))
    mlflow.set_tracking_uri(mlflow_server.url)
    experiment = client.create_experiment(f"user-names-{uuid.uuid4().hex[:8]}")
    # 4 Keras names + hvd-mlflow's 3 per-epoch extras: the 7 places of max_metric_names=7
    hvd_mlflow.autolog(max_metric_names=7)
    try:
        model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=["accuracy"])
        x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
        y = (x[:, 0] > 0).astype("float32")
        with mlflow.start_run(experiment_id=experiment) as run:
            model.fit(x, y, epochs=2, verbose=0, validation_data=(x, y))
            mlflow.log_metric("test_score", 0.5, step=3)  # no place left for it
            mlflow.log_metric("loss", 9.0, step=7)  # a name the run holds: always fine
    finally:
        hvd_mlflow.autolog(disable=True)
        mlflow.set_tracking_uri(None)
    data = client.get_run(run.info.run_id).data
    assert len(data.metrics) == 7 and "test_score" not in data.metrics, sorted(data.metrics)
    assert [m.value for m in client.get_metric_history(run.info.run_id, "loss") if m.step == 7] == [9.0]
    [held] = [f.path for f in client.list_artifacts(run.info.run_id, "hvd_mlflow") if "user-metrics" in f.path]
    with open(client.download_artifacts(run.info.run_id, held, str(tmp_path))) as f:
        rows = list(csv.DictReader(f))
    assert [(r["name"], int(r["step"]), float(r["value"])) for r in rows] == [("test_score", 3, 0.5)]
    assert "your metric 'test_score' is not logged as a metric" in caplog.text
