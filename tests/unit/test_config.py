from __future__ import annotations

import dataclasses

import pytest

from hvd_mlflow.config import AutologOptions, Options


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
