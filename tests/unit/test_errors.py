from __future__ import annotations

import inspect
from pathlib import Path

import pytest

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


def test_the_errors_the_docs_call_also_a_builtin_error_are_one():
    """reference.md: `hvd_mlflow.EmptyShardError` and `hvd_mlflow.ShardMismatchError` are also a `ValueError` (and
    `MissingDependencyError` an `ImportError`), so `except ValueError` catches them; every such claim is checked."""
    import builtins
    import re

    claims = re.findall(r"`hvd_mlflow\.(\w+)` \(also an? `(\w+)`\)", REFERENCE.read_text())
    assert {("EmptyShardError", "ValueError"), ("ShardMismatchError", "ValueError")} <= set(claims)
    for name, builtin in claims:
        error = getattr(hvd_mlflow, name)("raised")
        with pytest.raises(getattr(builtins, builtin)):  # what a user's `except ValueError:` catches
            raise error
