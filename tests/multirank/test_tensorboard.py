"""Keras' TensorBoard callback on every rank, as users add it (tests/workers/fit_worker.py --tensorboard): only rank
0's process writes into the shared folder, its epoch scalars are the global values (the mean of the ranks' own,
as Keras computed them) and equal the run's history, and its event files land in the run's artifacts, also when the
server refused them at the end of fit and ``hvd-mlflow sync`` sends them later."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.support import launch
from tests.support.checks import FAST_RETRIES, expected_global, sync
from tests.support.proxy import RESET, Proxy

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]
EPOCHS = 3


@pytest.fixture(autouse=True)
def _artifacts_read_from_the_session_s_server(monkeypatch, mlflow_server):
    """MLflow 2.12's client resolves ``mlflow-artifacts:`` locations with the process's tracking URI, not its own
    (the oldest row failed: "scheme 'file' is invalid for use with the proxy mlflow-artifact scheme")."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(mlflow_server.url)
    yield
    mlflow.set_tracking_uri(previous)


def scalars(folder: Path) -> dict[str, list[float]]:
    """Every scalar of the event files in ``folder``, by tag, in step order (TensorBoard's own record format)."""
    import tensorflow as tf

    points: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.HasField("tensor"):
                    if value.metadata.plugin_data.plugin_name != "scalars":
                        continue  # the model's config as text, histograms...
                    number = float(tf.make_ndarray(value.tensor))
                else:
                    number = value.simple_value
                points.setdefault(value.tag, []).append((event.step, number))
    return {tag: [v for _, v in sorted(series)] for tag, series in points.items()}


def artifact_files(client, run_id: str, path: str = "tensorboard") -> set[str]:
    out: set[str] = set()
    for item in client.list_artifacts(run_id, path):
        out |= artifact_files(client, run_id, item.path) if item.is_dir else {item.path}
    return out


def local_files(folder: Path) -> set[str]:
    return {f"tensorboard/{p.relative_to(folder).as_posix()}" for p in folder.rglob("*") if p.is_file()}


def history(client, run_id: str, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def test_rank0_tensorboard_shows_the_global_values_and_lands_in_the_run(tmp_path, client):
    run_id = client.create_run(client.create_experiment(f"tb-{uuid.uuid4().hex[:8]}")).info.run_id
    env = {"MLFLOW_TRACKING_URI": client.tracking_uri, "MLFLOW_RUN_ID": run_id}
    done = launch.run(tmp_path, ["--epochs", str(EPOCHS), "--tensorboard", "tb"], env=env).check()
    ranks = [done.rank(0), done.rank(1)]
    folder = tmp_path / "tb"
    events = sorted(folder.rglob("events.out.tfevents.*"))
    # only rank 0's process wrote into the shared folder (an event file's name carries its writer's pid)
    assert events and all(f".{ranks[0]['pid']}." in p.name for p in events), [p.name for p in events]
    assert "rank 1 runs no TensorBoard callback" in done.output
    expected = expected_global(ranks, EPOCHS)
    assert any(ranks[0]["local"][e]["loss"] != ranks[1]["local"][e]["loss"] for e in range(EPOCHS))  # ranks differ
    train, validation = scalars(folder / "train"), scalars(folder / "validation")
    pairs = [(train, "loss", "epoch_loss"), (train, "accuracy", "epoch_accuracy"),
             (validation, "val_loss", "epoch_loss"), (validation, "val_accuracy", "epoch_accuracy")]  # fmt: skip
    for board, key, tag in pairs:
        assert board[tag] == pytest.approx(expected[key], rel=1e-6), (key, board[tag], expected[key])
        assert board[tag] == pytest.approx(history(client, run_id, key), rel=1e-6), key
    # rank 0's event files are in the run, each of them, and nothing else under tensorboard/
    assert artifact_files(client, run_id) == local_files(folder)


def test_event_files_refused_at_the_end_of_fit_are_sent_by_sync(tmp_path, mlflow_server, client):
    run_id = client.create_run(client.create_experiment(f"tb-sync-{uuid.uuid4().hex[:8]}")).info.run_id

    def no_artifacts(request):  # the artifact store does not answer; everything else does
        return RESET if "/mlflow-artifacts/" in request.path else None

    with Proxy(mlflow_server.url, fault=no_artifacts) as proxy:
        env = {**FAST_RETRIES, "HVD_MLFLOW_FLUSH_TIMEOUT": "8", "MLFLOW_TRACKING_URI": proxy.url,
               "MLFLOW_RUN_ID": run_id}  # fmt: skip
        done = launch.run(tmp_path, ["--epochs", str(EPOCHS), "--tensorboard", "tb"], env=env).check()
        assert any("/mlflow-artifacts/" in r.path for r in proxy.requests)  # it tried
    assert done.rank(0)["train_end_s"] <= 8 + 2
    assert artifact_files(client, run_id) == set()
    assert history(client, run_id, "loss") == pytest.approx(
        expected_global([done.rank(0), done.rank(1)], EPOCHS)["loss"]
    )
    synced = sync(tmp_path, "--tracking-uri", mlflow_server.url)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert artifact_files(client, run_id) == local_files(tmp_path / "tb")
    again = sync(tmp_path, "--tracking-uri", mlflow_server.url)
    assert again.returncode == 0 and artifact_files(client, run_id) == local_files(tmp_path / "tb")


def batch_scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of one scalar tag, in the order the event files hold them."""
    import tensorflow as tf

    out = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == tag:
                    out.append((event.step, float(tf.make_ndarray(value.tensor)) if value.HasField("tensor")
                                else value.simple_value))  # fmt: skip
    return out


def test_batch_scalars_are_global_at_the_batches_hvd_mlflow_reduces(tmp_path, client, keras_mode):
    """TensorBoard(update_freq=50) with log_every_n_steps=50, 100 batches per epoch: the logged batches are reduced
    in bulk, one collective per 2 of them (about 100 optimizer steps); at the batch where that collective runs,
    rank 0's batch scalars are the global values (hvd-mlflow's callback runs first and writes them into the batch
    logs), equal to the run's batch/ curve; at the other batches they are rank 0's own running values."""
    from hvd_mlflow.every_rank.batch_steps import logged_batches_per_collective

    every, epochs, per_epoch = 50, 2, 100
    per_collective = logged_batches_per_collective(every)
    run_id = client.create_run(client.create_experiment(f"tb-batch-{uuid.uuid4().hex[:8]}")).info.run_id
    env = {"MLFLOW_TRACKING_URI": client.tracking_uri, "MLFLOW_RUN_ID": run_id}
    done = launch.run(tmp_path, ["--epochs", str(epochs), "--samples", str(16 * per_epoch), "--tensorboard", "tb",
                                 "--tensorboard-update-freq", str(every), "--log-every-n-steps", str(every)],
                      env=env).check()  # fmt: skip
    ranks = [done.rank(0), done.rank(1)]
    local = [{b["iterations"]: b["loss"] for b in r["local_batches"]} for r in ranks]
    steps = sorted(local[0])  # the optimizer's iterations, 1..batches
    assert steps == list(range(1, epochs * per_epoch + 1))
    logged = [s for s in steps if s % every == 0]
    # the logged batches at which a collective runs: every per_collective-th of an epoch's (the epoch end takes the
    # rest), here the epochs' last batches
    collective = {s for e in range(epochs) for i, s in enumerate(x for x in logged if (x - 1) // per_epoch == e)
                  if (i + 1) % per_collective == 0}  # fmt: skip
    assert collective == {per_epoch * (e + 1) for e in range(epochs)}, collective
    written = batch_scalars(tmp_path / "tb" / "train", "batch_loss")
    import keras

    version = tuple(int(part) for part in keras.__version__.split(".")[:2])
    if keras_mode == "keras" and (3, 0) <= version < (3, 15):
        # Keras 3.3.3's TensorBoard writes every batch at step 0 (set_model sets _train_step = 0 and nothing moves
        # it on), one scalar per batch in order: the n-th is the n-th batch (Keras 3.15.1 writes as tf_keras does;
        # the versions between are not tested)
        assert [s for s, _ in written] == [0] * len(steps), written[:5]
        board = {steps[n]: v for n, (_, v) in enumerate(written)}
    else:  # tf_keras, Keras 2 and Keras 3.15 write at the optimizer's iterations where iterations % update_freq == 0
        board = dict(written)
        assert sorted(board) == logged, sorted(board)
    reduced = {p.step: p.value for p in client.get_metric_history(run_id, "batch/loss")}
    assert sorted(reduced) == logged
    for step in logged:  # the run's batch curve: the mean of the ranks' own running values (equal batches)
        assert reduced[step] == pytest.approx((local[0][step] + local[1][step]) / 2, rel=1e-6), step
    for step, value in board.items():
        if step in collective:  # global, as in the run
            assert value == pytest.approx(reduced[step], rel=1e-6), step
        else:  # rank 0's own
            assert value == pytest.approx(local[0][step], rel=1e-6), step
    assert all(local[0][s] != local[1][s] for s in collective)  # the ranks disagreed: global is not rank 0's


def test_log_tensorboard_false_uploads_nothing_and_still_keeps_other_ranks_out(tmp_path, client):
    run_id = client.create_run(client.create_experiment(f"tb-off-{uuid.uuid4().hex[:8]}")).info.run_id
    env = {"MLFLOW_TRACKING_URI": client.tracking_uri, "MLFLOW_RUN_ID": run_id}
    with Proxy(client.tracking_uri) as proxy:
        env["MLFLOW_TRACKING_URI"] = proxy.url
        done = launch.run(tmp_path, ["--epochs", str(EPOCHS), "--tensorboard", "tb", "--no-log-tensorboard"],
                          env=env).check()  # fmt: skip
        artifact_requests = [r.path for r in proxy.requests if "artifacts" in r.path]
    folder = tmp_path / "tb"
    events = sorted(folder.rglob("events.out.tfevents.*"))
    assert events and all(f".{done.rank(0)['pid']}." in p.name for p in events)  # rank 0's TensorBoard still runs
    assert artifact_files(client, run_id) == set() and not any("tensorboard" in p for p in artifact_requests)
    assert history(client, run_id, "loss") == pytest.approx(
        expected_global([done.rank(0), done.rank(1)], EPOCHS)["loss"]
    )


def file_bytes(folder: Path, leave_out: set[str] = frozenset()) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative path, with its bytes (``leave_out``: top-level names)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.relative_to(folder).parts[0] not in leave_out}  # fmt: skip


def test_the_run_holds_this_fits_event_files_as_closed_and_nothing_else(tmp_path, client):
    """TensorBoard(update_freq=1) writes a batch summary at every batch, and its profiler (tensorboard_profile) runs
    until TensorBoard's on_train_end stops it; its log folder already holds an earlier run's files (rank-1/ ones too);
    with tensorboard_per_rank rank 1 writes into rank-1/. The run's tensorboard/ artifacts are, byte for byte, the
    files this fit wrote, as they are on disk after fit (every batch summary and the trace in them), and none of the
    earlier run's nor of rank 1's."""
    import os

    import tensorflow as tf

    folder = tmp_path / "tb"
    with tf.summary.create_file_writer(str(folder / "train")).as_default():  # an earlier run's real event file
        tf.summary.scalar("epoch_loss", 0.5, step=0)
    by_hand = {"validation/events.out.tfevents.1000.earlier.2.v2": b"an earlier run's validation events",
               "notes.txt": b"left here by hand", "rank-1/train/events.out.tfevents.1000.earlier": b"r1"}  # fmt: skip
    for name, content in by_hand.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    for path in folder.rglob("*"):
        os.utime(path, (1_000_000_000, 1_000_000_000))
    earlier = file_bytes(folder)
    run_id = client.create_run(client.create_experiment(f"tb-closed-{uuid.uuid4().hex[:8]}")).info.run_id
    env = {"MLFLOW_TRACKING_URI": client.tracking_uri, "MLFLOW_RUN_ID": run_id, "HVD_MLFLOW_TENSORBOARD_PER_RANK": "1",
           "HVD_MLFLOW_TENSORBOARD_PROFILE": "1"}  # fmt: skip
    # tf_keras calls TensorBoard's batch hooks only when a callback in the list implements them: log_every_n_steps.
    # profile_batch=(2, 1000): the profiler runs from batch 2 past the last one, so TensorBoard's on_train_end stops
    # it, writing its trace (plugins/profile/) and the traced graph (into train/'s event file) only then.
    done = launch.run(tmp_path, ["--epochs", str(EPOCHS), "--tensorboard", "tb", "--tensorboard-update-freq", "1",
                                 "--log-every-n-steps", "3", "--tensorboard-profile-batch", "2,1000"],
                      env=env).check()  # fmt: skip
    ranks = [done.rank(0), done.rank(1)]
    local = file_bytes(folder, leave_out={"rank-1"})
    written = {name: content for name, content in local.items() if name not in earlier}
    assert {n: local[n] for n in local if n not in written} == {n: c for n, c in earlier.items()
                                                                 if not n.startswith("rank-1/")}  # fmt: skip
    assert all(f".{ranks[0]['pid']}." in Path(n).name for n in written if "tfevents" in n), sorted(written)
    rank1 = [p.name for p in (folder / "rank-1").rglob("events.out.tfevents.*") if "earlier" not in p.name]
    assert rank1 and all(f".{ranks[1]['pid']}." in n for n in rank1)  # rank 1's own folder, on its disk
    assert any("/plugins/profile/" in f"/{n}" for n in written), sorted(written)  # the trace stopped at train end
    batches = EPOCHS * -(-96 // 16)
    assert len(batch_scalars(folder / "train", "batch_loss")) == batches  # every batch summary is on disk
    (tmp_path / "downloaded").mkdir()  # MLflow 2.12 refuses a destination that does not exist
    downloaded = Path(client.download_artifacts(run_id, "tensorboard", str(tmp_path / "downloaded")))
    assert file_bytes(downloaded) == written  # the same names, the same bytes
    assert len(batch_scalars(downloaded / "train", "batch_loss")) == batches
