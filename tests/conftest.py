"""Session-wide fixtures: one real ``mlflow server`` for the whole test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.mlflow_server import MlflowServer

os.environ.setdefault("HVD_MLFLOW_TESTING", "1")  # rank 0's guard re-raises: no bug hides behind a warning
os.environ.setdefault("HVD_MLFLOW_LOG_MODELS", "0")  # the model tests turn it on: a model save costs seconds
ARTIFACTS = Path(os.environ.get("HVD_MLFLOW_TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts"))


def pytest_sessionstart(session: pytest.Session) -> None:
    """The rank zygotes' import (HVD_MLFLOW_TEST_RANK_ZYGOTE=1) runs beside the first tests, not before a job."""
    from tests.support.launch import prestart_rank_zygotes

    prestart_rank_zygotes()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """A real ``mlflow server`` on 127.0.0.1 (sqlite backend), started once per session."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    yield server
    server.stop()


@pytest.fixture
def client(mlflow_server):
    from mlflow import MlflowClient

    return MlflowClient(mlflow_server.url)


@pytest.fixture
def keras_mode() -> str:
    """The Keras flavour this test session runs in (set by the environment, as in a user's job)."""
    import tensorflow as tf

    return tf.keras.Model.__module__.split(".", 1)[0]
