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
    run_logger.start()
    run_logger.sender.begin()
    run_logger.log_params({"long": "x" * 7000, "short": "ok"})
    values = {"loss": math.nan, "grad_norm": math.inf, "neg": -math.inf, "acc": 0.5}
    run_logger.log_metrics_many([(0, int(time.time() * 1000), values)])
    assert run_logger.close("FINISHED", deadline=time.monotonic() + 30)
    run = client.get_run(run_id)
    assert run.data.params["short"] == "ok" and run.data.params["long"] == "x" * 6000
    assert sum("'long' is 7000 characters long" in r.getMessage() for r in caplog.records) == 1
    assert math.isnan(client.get_metric_history(run_id, "loss")[0].value)
    assert client.get_metric_history(run_id, "grad_norm")[0].value > 1e300  # MLflow stores +Inf as max float
    assert client.get_metric_history(run_id, "neg")[0].value < -1e300
    assert client.get_metric_history(run_id, "acc")[0].value == 0.5
