from __future__ import annotations

import pytest

from hvd_mlflow.rank_zero.guard import RankZeroGuard


def test_a_failing_step_is_one_warning_and_only_an_essential_one_turns_logging_off(monkeypatch, caplog):
    monkeypatch.delenv("HVD_MLFLOW_TESTING", raising=False)
    off = []
    guard = RankZeroGuard(logging_off=lambda: off.append(True))
    for _ in range(3):
        with guard.step("params"):
            raise RuntimeError("boom")
    assert off == [] and caplog.text.count("params failed on rank 0 (RuntimeError: boom)") == 1
    with guard.step("the sender", essential=True):
        raise OSError("no thread")
    assert off == [True] and "MLflow logging is off for the rest of this fit" in caplog.text
    assert caplog.text.count("failed on rank 0") == 2  # one warning per step and error type


def test_under_the_test_suite_the_guard_re_raises(monkeypatch):
    monkeypatch.setenv("HVD_MLFLOW_TESTING", "1")
    guard = RankZeroGuard(logging_off=lambda: None)
    with pytest.raises(RuntimeError, match="boom"), guard.step("params"):
        raise RuntimeError("boom")


def test_params_and_tags_whose_names_collide_go_to_their_artifact_redacted(tmp_path, monkeypatch):
    """Two names that clean to one (``a@b``, ``a#b``) keep their own names in a JSON artifact: their values are
    masked there as everywhere else hvd-mlflow writes (a credential in a URI, a secret variable's value)."""
    from hvd_mlflow.delivery.destination import Destination
    from hvd_mlflow.rank_zero.run_logger import RunLogger

    monkeypatch.setenv("HVD_MLFLOW_TESTING", "1")
    monkeypatch.setenv("MY_API_TOKEN", "tok-1234567890")
    dest = Destination(tracking_uri="http://127.0.0.1:9", run_id="r1", experiment_id=None, experiment_name=None,
                       job_mode=False)  # fmt: skip
    logger = RunLogger(dest, tmp_path)
    try:
        logger.log_params({"db@uri": "postgresql://user:hunter2@db:5432/x", "db#uri": "tok-1234567890"})
        logger.log_tags({"t@k": "https://u:pw@h/x", "t#k": "plain"})
        artifacts = [e.payload for e in logger.journal.pending() if e.kind == "artifact"]
    finally:
        logger.sender.stop()
    text = repr(artifacts)
    assert artifacts and "hunter2" not in text and "tok-1234567890" not in text and "pw@" not in text, text
    assert "plain" in text  # what is not a secret stays


@pytest.mark.parametrize(
    ("uri", "job_run", "given", "logs"),
    [
        ("http://127.0.0.1:5000", None, None, True),  # outside AzureML: on by default
        ("azureml://eastus.api.azureml.ms/mlflow/v1.0/subscriptions/s", "job-run", None, False),  # a job: off
        ("azureml://eastus.api.azureml.ms/mlflow/v1.0/subscriptions/s", None, None, True),  # AzureML, not a job
        ("azureml://eastus.api.azureml.ms/mlflow/v1.0/subscriptions/s", "job-run", True, True),  # asked for
        ("http://127.0.0.1:5000", None, False, False),
    ],
)
def test_log_models_is_on_by_default_except_in_an_azureml_job(monkeypatch, uri, job_run, given, logs):
    """reference.md's `log_models` row, README and azureml.md: default on, off in an AzureML job (``azureml://``
    tracking and the job's ``AZUREML_RUN_ID``), as given when given."""
    import mlflow

    from hvd_mlflow.config import Options
    from hvd_mlflow.every_rank.collectives import Solo
    from hvd_mlflow.rank_zero.steps import RankZeroSteps

    monkeypatch.setattr(mlflow, "get_tracking_uri", lambda: uri)
    if job_run:
        monkeypatch.setenv("AZUREML_RUN_ID", job_run)
    else:
        monkeypatch.delenv("AZUREML_RUN_ID", raising=False)
    steps = RankZeroSteps.__new__(RankZeroSteps)  # the decision alone: no fit, no run
    steps._comm, steps.options = Solo(), Options.resolve(environ={}, log_models=given)
    assert steps._logs_models() is logs
