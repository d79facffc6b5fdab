"""Session-wide fixtures: one real ``mlflow server`` for the whole test session."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.support.mlflow_server import MlflowServer
from tests.support.startup import sitecustomize as startup

os.environ.setdefault("HVD_MLFLOW_TESTING", "1")  # rank 0's guard re-raises: no bug hides behind a warning
os.environ.setdefault("HVD_MLFLOW_LOG_MODELS", "0")  # the model tests turn it on: a model save costs seconds
# The JAX row has no TensorFlow: only its own tests (tests/jax) are collected there, the others import TensorFlow.
if importlib.util.find_spec("tensorflow") is None:
    _OWN = ("jax", "support", "workers", "__pycache__")
    collect_ignore_glob = [f"{f.name}/*" for f in Path(__file__).parent.iterdir() if f.is_dir() and f.name not in _OWN]
startup.for_session()  # test speed: tf_keras unconverted by autograph here and in the processes this one starts
ARTIFACTS = Path(os.environ.get("HVD_MLFLOW_TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts"))


# Tests that launch several processes which train (Horovod ranks, tf.distribute workers, mpirun over nodes) or that
# bound how long something takes: each runs with no other test beside it (scripts/test.sh runs the others two at a
# time, pytest-xdist). Such a test carries one of these markers, or "alone" itself. A multi-rank test marked "shared"
# bounds no duration and shares no module-scoped job with other tests: it may run beside another test.
ALONE = ("multirank", "faults", "multinode", "mpirun", "tfdistribute", "alone")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        reasons = {name for name in ALONE if item.get_closest_marker(name)}
        if item.get_closest_marker("shared"):
            reasons.discard("multirank")  # "shared" lifts this one only: never a duration bound, a fault, a node
        if reasons and not item.get_closest_marker("alone"):
            item.add_marker(pytest.mark.alone)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The rank zygotes' import (HVD_MLFLOW_TEST_RANK_ZYGOTE=1) starts beside the first tests, if a test of this
    session launches Horovod ranks or tf.distribute workers; a session without such tests starts none."""
    from tests.support.launch import prestart_rank_zygotes

    if any(item.get_closest_marker(name) for item in session.items for name in ("multirank", "tfdistribute")):
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
