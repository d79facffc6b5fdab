from __future__ import annotations

import dataclasses
import logging
import sys

import pytest

from hvd_mlflow.config import AutologOptions, Options
from tests.support.flavours import importable


def test_options_argument_beats_environment_beats_default():
    env = {"HVD_MLFLOW_FLUSH_TIMEOUT": "5", "HVD_MLFLOW_EXTRA_TAGS": "team=vision, owner = me"}
    assert Options.resolve(env).flush_timeout == 5.0
    assert Options.resolve(env, flush_timeout=7).flush_timeout == 7
    assert Options.resolve({}).flush_timeout == 60.0
    assert Options.resolve(env).extra_tags == {"team": "vision", "owner": "me"}
    assert Options.resolve({"HVD_MLFLOW_SILENT": "yes"}).silent is True


def test_bad_environment_value_is_a_clear_error():
    with pytest.raises(ValueError, match="HVD_MLFLOW_FLUSH_TIMEOUT='soon'"):
        Options.resolve({"HVD_MLFLOW_FLUSH_TIMEOUT": "soon"})
    with pytest.raises(TypeError, match="unknown option"):
        Options.resolve({}, flush_timeuot=3)


def test_training_dynamics_options_from_the_environment_and_arguments():
    env = {
        "HVD_MLFLOW_LOG_EVERY_N_STEPS": "50",
        "HVD_MLFLOW_RANK_SPREAD": "loss, val_loss",
        "HVD_MLFLOW_RESUME": "log",
        "HVD_MLFLOW_LOG_MODELS": "off",
    }
    options = Options.resolve(env)
    assert (options.log_every_n_steps, options.rank_spread, options.resume, options.log_models) == (
        50,
        ("loss", "val_loss"),
        "log",
        False,
    )
    assert Options.resolve(env, rank_spread=["auc"]).rank_spread == ("auc",)
    assert Options.resolve({}).log_models is None  # decided by where it runs: on, except in AzureML jobs
    with pytest.raises(ValueError, match="resume='later': choose one of skip, log"):
        Options.resolve({}, resume="later")
    with pytest.raises(ValueError, match="HVD_MLFLOW_LOG_EVERY_N_STEPS='ten'"):
        Options.resolve({"HVD_MLFLOW_LOG_EVERY_N_STEPS": "ten"})
    with pytest.raises(ValueError, match="log_every_n_steps=-1"):
        Options.resolve({}, log_every_n_steps=-1)


def test_the_callback_refuses_autolog_only_options_and_autolog_options_are_callback_options():
    with pytest.raises(TypeError, match="guard_other_ranks: an option of hvd_mlflow.autolog"):
        Options.for_callback(guard_other_ranks=False)
    resolved = AutologOptions.resolve({}, reduction="mean")
    assert Options.for_callback(options=resolved) is resolved  # resolved once, passed as an object
    assert Options.for_callback(csv_path="x.csv").csv_path == "x.csv"


def test_the_options_that_shape_collectives():
    options = Options.resolve({"HVD_MLFLOW_LOG_EVERY_N_STEPS": "4"}, rank_spread="loss")
    assert dict(options.collective()) == {"reduction": "exact", "log_every_n_steps": 4, "rank_spread": ("loss",),
                                          "check_divergence": True, "system_metrics": False}  # fmt: skip


def test_autolog_takes_every_option_and_only_options():
    import inspect

    from hvd_mlflow.autologging import autolog

    arguments = set(inspect.signature(autolog).parameters) - {"disable"}
    assert arguments == {field.name for field in dataclasses.fields(AutologOptions)}


# docs/reference.md, under the options table: what `print(error)` shows for autolog(reduction="median")
BAD_REDUCTION = "reduction='median': choose one of exact, weighted, mean"


def test_a_bad_reduction_fails_when_autolog_is_called_or_the_callback_is_created(monkeypatch):
    """reference.md: a bad value fails when `autolog()` or the callback is created, never in the middle of `fit`,
    with the message the docs print; `autolog()` that refused leaves every Keras `fit` as it was."""
    import hvd_mlflow
    from hvd_mlflow.every_rank import keras_flavour

    models = [keras_flavour.model_class(flavour) for flavour in importable()]
    fits = [model.fit for model in models]
    try:
        with pytest.raises(ValueError) as refused:
            hvd_mlflow.autolog(reduction="median")
        assert str(refused.value) == BAD_REDUCTION
        assert [model.fit for model in models] == fits  # nothing was wrapped
    finally:
        hvd_mlflow.autolog(disable=True)
    with pytest.raises(ValueError) as refused:
        hvd_mlflow.HorovodMlflowCallback(reduction="median")
    assert str(refused.value) == BAD_REDUCTION
    monkeypatch.setenv("HVD_MLFLOW_REDUCTION", "median")  # the same value from the environment
    with pytest.raises(ValueError) as refused:
        hvd_mlflow.HorovodMlflowCallback()
    assert str(refused.value) == BAD_REDUCTION
    # Options made directly and passed as options= (autolog's way in) are checked too: every rank refuses them
    # alike, where the reducer would otherwise take an unknown mode for weighted (failed on 01f8d50)
    with pytest.raises(ValueError) as refused:
        hvd_mlflow.HorovodMlflowCallback(options=Options(reduction="median"))
    assert str(refused.value) == BAD_REDUCTION


def _psutil_warnings(monkeypatch, caplog) -> list[str]:
    """What hvd-mlflow says when a system-metrics sampler starts without psutil (a real warning of the package)."""
    from hvd_mlflow import _log
    from hvd_mlflow.every_rank import system_metrics

    monkeypatch.setitem(sys.modules, "psutil", None)
    monkeypatch.setattr(_log, "_said", set())
    caplog.clear()
    sampler = system_metrics.SystemSampler()
    sampler.start()
    sampler.stop()
    return [r.getMessage() for r in caplog.records if r.name.startswith("hvd_mlflow") and "psutil" in r.getMessage()]


@pytest.mark.parametrize("given", ["argument", "environment"])
def test_silent_means_no_warnings_from_hvd_mlflow(monkeypatch, caplog, given):
    """reference.md's `silent` row: no warnings from hvd-mlflow. A callback created with it silences a warning
    the package gives otherwise (the same one, said again by a callback created without it)."""
    from hvd_mlflow import HorovodMlflowCallback, _log

    try:
        with caplog.at_level(logging.WARNING):  # the root's level: hvd_mlflow's own level stays as silent set it
            if given == "environment":
                monkeypatch.setenv("HVD_MLFLOW_SILENT", "1")
                HorovodMlflowCallback()
            else:
                HorovodMlflowCallback(silent=True)
            assert _psutil_warnings(monkeypatch, caplog) == []
            monkeypatch.delenv("HVD_MLFLOW_SILENT", raising=False)
            HorovodMlflowCallback(silent=False)
            assert len(_psutil_warnings(monkeypatch, caplog)) == 1
    finally:
        _log.set_silent(False)


def test_autolog_silent_means_no_warnings_before_the_first_fit_either(tmp_path, monkeypatch, caplog):
    """`autolog(silent=True)`, then a script's `mlflow.tensorflow.autolog()`, which autolog's guard turns off with a
    warning (said when not silent: tests/unit/test_guard.py): with `silent` nothing is said."""
    import mlflow

    import hvd_mlflow
    from hvd_mlflow import _log

    monkeypatch.setattr(_log, "_said", set())
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        with caplog.at_level(logging.WARNING):
            hvd_mlflow.autolog(silent=True)
            import mlflow.tensorflow

            mlflow.tensorflow.autolog()
    finally:
        hvd_mlflow.autolog(disable=True)
        _log.set_silent(False)
        mlflow.set_tracking_uri(None)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("hvd_mlflow")] == []
