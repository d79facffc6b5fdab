from __future__ import annotations

import json

import pytest

from hvd_mlflow.config import Options
from hvd_mlflow.redact import mask_uri, redact
from hvd_mlflow.topology import from_environment


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, (0, 1, 0, "single-process")),
        (
            {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
            (3, 8, 1, "open-mpi"),
        ),
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, (1, 2, 1, "pmi")),
        ({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, (2, 4, 0, "torch-style")),
        (
            {
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": {"chief": ["a"], "worker": ["b", "c"]},
                        "task": {"type": "worker", "index": 1},
                    }
                )
            },
            (2, 3, 0, "tf-config"),
        ),
    ],
)
def test_topology_from_launcher_environment(environ, expected):
    t = from_environment(environ)
    assert (t.rank, t.size, t.local_rank, t.source) == expected


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


def test_credentials_are_masked():
    assert mask_uri("https://alice:hunter22@host/x?token=abc&a=1") == "https://***@host/x?token=***&a=1"
    assert mask_uri("sqlite:////work/mlflow.db") == "sqlite:////work/mlflow.db"
    text = "POST https://u:p4ssw0rd@h/x failed; token eyJhbGciOi.secret"
    out = redact(text, {"MLFLOW_TRACKING_TOKEN": "eyJhbGciOi.secret", "HOME": "/root"})
    assert "p4ssw0rd" not in out and "eyJhbGciOi.secret" not in out and "/x failed" in out


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
    with pytest.raises(ValueError, match="resume='later': choose skip or log"):
        Options.resolve({}, resume="later")
    with pytest.raises(ValueError, match="HVD_MLFLOW_LOG_EVERY_N_STEPS='ten'"):
        Options.resolve({"HVD_MLFLOW_LOG_EVERY_N_STEPS": "ten"})
    with pytest.raises(ValueError, match="log_every_n_steps=-1"):
        Options.resolve({}, log_every_n_steps=-1)
