from __future__ import annotations

import inspect
from pathlib import Path

import hvd_mlflow
from hvd_mlflow import errors

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def test_every_error_a_user_can_meet_is_exported_documented_and_an_hvd_mlflow_error():
    defined = {
        name for name, value in inspect.getmembers(errors, inspect.isclass) if value.__module__ == errors.__name__
    }
    assert {"HvdMlflowError", "MissingDependencyError", "MetricKeyMismatchError"} <= defined
    reference = REFERENCE.read_text()
    for name in defined:
        assert name in hvd_mlflow.__all__, name
        assert issubclass(getattr(hvd_mlflow, name), hvd_mlflow.HvdMlflowError), name
        assert f"hvd_mlflow.{name}" in reference, f"{name} is not in docs/reference.md"
    assert issubclass(hvd_mlflow.MissingDependencyError, ImportError)  # `except ImportError` keeps working
