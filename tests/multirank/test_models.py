"""The trained model is logged by rank 0 as an MLflow model, by default, outside AzureML jobs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hvd_mlflow.common import compat
from tests.support import launch

pytestmark = [pytest.mark.multirank, pytest.mark.shared, pytest.mark.oldest, pytest.mark.timeout(600)]


def test_model_logged_by_default_as_an_mlflow_model(tmp_path, mlflow_server, client):
    import mlflow.tensorflow

    done = launch.run(
        tmp_path,
        ["--epochs", "2", "--probe"],
        env={"MLFLOW_TRACKING_URI": mlflow_server.url, "HVD_MLFLOW_LOG_MODELS": ""},  # unset: the default
    ).check()
    rank0 = done.rank(0)
    run_id = rank0["run_id"]
    if compat.mlflow3():  # a logged model, linked to the run
        models = client.search_logged_models(experiment_ids=["0"], filter_string=f"source_run_id = '{run_id}'")
        assert len(models) == 1  # one model, from rank 0 only
        model_uri = models[0].model_uri
    else:  # MLflow 2.x: the model in the run's artifacts, recorded in the run's model history
        history = json.loads(client.get_run(run_id).data.tags["mlflow.log-model.history"])
        assert [entry["artifact_path"] for entry in history] == ["model"]  # one model, from rank 0 only
        model_uri = f"runs:/{run_id}/model"
    mlflow.set_tracking_uri(mlflow_server.url)
    loaded = mlflow.tensorflow.load_model(model_uri)
    predicted = np.asarray(loaded.predict(np.asarray(rank0["probe_x"], dtype="float32"), verbose=0)).ravel()
    assert predicted == pytest.approx(rank0["probe_y"], rel=1e-5, abs=1e-6)  # the trained weights
    assert client.get_run(run_id).info.status == "FINISHED"
