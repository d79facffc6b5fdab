"""Bad values through the whole rank-0 path (journal, sender, a real server): NaN and Inf kept, long params cut."""

from __future__ import annotations

import logging
import math
import time
import uuid

import pytest

from hvd_mlflow.delivery.destination import Destination
from hvd_mlflow.rank_zero.run_logger import RunLogger

pytestmark = pytest.mark.once  # the command line and the uploader: no Keras in them


def test_nan_inf_are_kept_and_overlong_params_truncated_with_a_warning(tmp_path, mlflow_server, client, caplog):
    caplog.set_level(logging.WARNING, "hvd_mlflow")
    run_id = client.create_run(client.create_experiment(f"values-{uuid.uuid4().hex[:8]}")).info.run_id
    run_logger = RunLogger(Destination(mlflow_server.url, run_id, None, None, False), tmp_path / "journal")
    run_logger.sender.start()
    run_logger.sender.begin()
    run_logger.log_params({"long": "x" * 7000, "short": "ok"})
    values = {"loss": math.nan, "grad_norm": math.inf, "neg": -math.inf, "acc": 0.5}
    run_logger.log_metrics_many([(0, int(time.time() * 1000), values)])
    assert run_logger.sender.close("FINISHED", deadline=time.monotonic() + 30)
    run = client.get_run(run_id)
    assert run.data.params["short"] == "ok" and run.data.params["long"] == "x" * 6000
    assert sum("'long' is 7000 characters long" in r.getMessage() for r in caplog.records) == 1
    assert math.isnan(client.get_metric_history(run_id, "loss")[0].value)
    assert client.get_metric_history(run_id, "grad_norm")[0].value > 1e300  # MLflow stores +Inf as max float
    assert client.get_metric_history(run_id, "neg")[0].value < -1e300
    assert client.get_metric_history(run_id, "acc")[0].value == 0.5


def test_tags_are_cut_to_azureml_lengths_with_a_warning(tmp_path, mlflow_server, client, caplog, monkeypatch):
    """azureml.md's limits table: tag keys cut to 100 characters and values to 1,000, each with a warning. The
    server here (plain MLflow) keeps longer ones, so what arrives is hvd-mlflow's cut, under AzureML's limits."""
    from hvd_mlflow.delivery import limits

    caplog.set_level(logging.WARNING, "hvd_mlflow")
    monkeypatch.setattr(limits, "for_tracking_uri", lambda uri: limits.AZUREML)
    run_id = client.create_run(client.create_experiment(f"tags-{uuid.uuid4().hex[:8]}")).info.run_id
    run_logger = RunLogger(Destination(mlflow_server.url, run_id, None, None, False), tmp_path / "journal")
    run_logger.sender.start()
    run_logger.sender.begin()
    long_key = "k" * 150
    run_logger.log_tags({long_key: "v" * 1500, "short": "s" * 1000})
    assert run_logger.sender.close("FINISHED", deadline=time.monotonic() + 30)
    tags = client.get_run(run_id).data.tags
    assert tags["k" * 100] == "v" * 1000 and tags["short"] == "s" * 1000
    assert not [key for key in tags if len(key) > 100 or len(tags[key]) > 1000]
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "1500 characters long" in m]) == 1, said  # the value
    assert len([m for m in said if f"tag name {long_key!r} is not accepted" in m and repr("k" * 100) in m]) == 1, said
