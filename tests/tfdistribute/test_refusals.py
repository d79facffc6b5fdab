"""The misconfigurations tf.distribute users meet, refused on every worker with one clear message, never N writers:

* ``TF_CONFIG`` names two workers but the model was built outside ``strategy.scope()``: each worker trains alone
  (before: each created or wrote the run as "rank 0 of 1");
* Keras 3 under MultiWorkerMirroredStrategy (keras-team/keras#20585: Keras 3 cannot train with it): refused before
  training with a message that names tf_keras.

The same refusals of Horovod under an MPI launcher (a world of one where the launcher started several) are
tests/unit/test_topology.py's and tests/multinode/test_mpirun.py's.
"""

from __future__ import annotations

import uuid

import pytest

from tests.support import tf_workers

pytestmark = [pytest.mark.tfdistribute, pytest.mark.timeout(300)]


def launch(tmp_path, client, args, env=None):
    experiment = f"tfd-refused-{uuid.uuid4().hex[:8]}"
    base = {"MLFLOW_TRACKING_URI": client.tracking_uri, "MLFLOW_EXPERIMENT_NAME": experiment}
    args = ["--scenarios", "classification", "--epochs", "1", *args]
    done = tf_workers.run(tmp_path, args, env={**base, **(env or {})}, timeout=240)
    made = client.get_experiment_by_name(experiment)
    runs = client.search_runs([made.experiment_id]) if made else []
    return done, runs


def test_a_model_built_outside_the_strategy_s_scope_is_refused_on_every_worker(tmp_path, client):
    done, runs = launch(tmp_path, client, ["--outside-scope"])
    assert done.returncode != 0, done.output[-4000:]
    for rank in (0, 1):
        raised = done.rank(rank)["raised"]
        assert raised.startswith("LauncherMismatchError: hvd-mlflow: TF_CONFIG names 2 workers"), raised
        assert "outside `strategy.scope()`" in raised and "MultiWorkerMirroredStrategy().scope()" in raised
    assert runs == []  # no writer at all: refused at train begin, before any run


def test_keras_3_under_multi_worker_mirrored_strategy_is_refused_naming_tf_keras(tmp_path, client):
    done, runs = launch(tmp_path, client, [], env={"TF_USE_LEGACY_KERAS": "0"})
    assert done.returncode != 0, done.output[-4000:]
    for rank in (0, 1):
        raised = done.rank(rank)["raised"]
        assert raised.startswith("HvdMlflowError: hvd-mlflow: Keras 3 cannot train with MultiWorkerMirroredStrategy")
        assert "tf-keras" in raised and "TF_USE_LEGACY_KERAS=1" in raised
        assert done.rank(rank)["flavour"] == "keras"
    assert runs == []


def test_log_models_is_off_under_the_strategy_and_every_worker_saves_its_model_as_azure_s_example_does(
    tmp_path, client
):
    """Saving a model under MultiWorkerMirroredStrategy runs the strategy's collectives on every worker: the chief
    logging the model alone at the end of fit waits for workers that never join, then the user's own model.save fails
    (seen on the code before: UnavailableError out of the chief's model.save). log_models=1 is refused with a
    warning, and the user's save after fit works on both workers."""
    done, runs = launch(tmp_path, client, ["--save", str(tmp_path / "saved")], env={"HVD_MLFLOW_LOG_MODELS": "1"})
    assert done.returncode == 0, done.output[-4000:]
    assert [done.rank(r)["scenarios"]["classification"]["saved"] for r in (0, 1)] == [True, True]
    assert "log_models is off under tf.distribute" in done.output
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert client.list_artifacts(runs[0].info.run_id, "model") == []  # no model logged by the chief alone
