"""Keras' TensorBoard callback on every tf.distribute worker, into one folder, as users add it: the chief's alone
writes (worker 1 runs none: tf_keras would have it write into ``workertemp_1/`` beside the chief's files, and delete
it), its epoch scalars are the global values (one process on the union of the workers' data, computed without
hvd-mlflow) and equal the run's curves, and its event files, each of them and nothing else, are in the run."""

from __future__ import annotations

import uuid

import pytest

from tests.multirank.test_tensorboard import artifact_files, history, local_files, scalars
from tests.support import tf_workers

pytestmark = [pytest.mark.tfdistribute, pytest.mark.timeout(600)]
EPOCHS = 2


@pytest.fixture(autouse=True)
def _artifacts_read_from_the_session_s_server(monkeypatch, mlflow_server):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(mlflow_server.url)
    yield
    mlflow.set_tracking_uri(previous)


def test_the_chief_s_tensorboard_alone_writes_the_global_values_and_lands_in_the_run(tmp_path, client):
    run_id = client.create_run(client.create_experiment(f"tfd-tb-{uuid.uuid4().hex[:8]}")).info.run_id
    env = {"MLFLOW_TRACKING_URI": client.tracking_uri, "MLFLOW_RUN_ID": run_id}
    args = ["--scenarios", "classification", "--lr0", "--epochs", str(EPOCHS), "--tensorboard", "tb"]
    done = tf_workers.run(tmp_path, args, env=env, timeout=400).check()
    ranks = [done.rank(0), done.rank(1)]
    folder = tmp_path / "tb"
    events = sorted(folder.rglob("events.out.tfevents.*"))
    # only the chief's process wrote into the shared folder (an event file's name carries its writer's pid)
    assert events and all(f".{ranks[0]['pid']}." in p.name for p in events), [p.name for p in events]
    assert not list(folder.glob("workertemp_*"))
    scenario = ranks[0]["scenarios"]["classification"]
    union_train, union_val = scenario["union_train"], scenario["union_val"]
    own = [r["scenarios"]["classification"]["own_train"]["loss"] for r in ranks]
    assert abs(own[0] - own[1]) > 1e-3  # the workers' own values differ: a worker's own curve would show
    train, validation = scalars(folder / "train"), scalars(folder / "validation")
    for board, key, tag, truth in [(train, "loss", "epoch_loss", union_train["loss"]),
                                   (train, "auc", "epoch_auc", union_train["auc"]),
                                   (validation, "val_loss", "epoch_loss", union_val["loss"]),
                                   (validation, "val_accuracy", "epoch_accuracy", union_val["accuracy"])]:  # fmt: skip
        assert board[tag] == pytest.approx([truth] * EPOCHS, rel=1e-6), (key, board[tag], truth)  # lr 0: every epoch
        assert board[tag] == pytest.approx(history(client, run_id, key), rel=1e-6), key
    assert artifact_files(client, run_id) == local_files(folder)  # the chief's files, each of them, nothing else
