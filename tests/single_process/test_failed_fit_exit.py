"""A bare ``HorovodMlflowCallback`` (no autolog) whose ``fit`` raises: Keras calls no ``on_train_end``, and the
process exits with the error. Rank 0 ends that fit at exit: the run ends FAILED with what was logged, a warning says
so on stderr, and when the server does not answer the delivery is bounded and the warning gives the ``hvd-mlflow sync``
command, after which the run is FAILED too (not KILLED). One process (tests/workers/fit_worker.py, no launcher)."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.support import launch
from tests.support.checks import journals, sync

pytestmark = pytest.mark.timeout(300)
ENDED = "fit did not end (it raised, or the process exits in it): its run ends FAILED"


def runs_of(client, experiment_name: str):
    experiment = client.get_experiment_by_name(experiment_name)
    return client.search_runs([experiment.experiment_id]) if experiment else []


@pytest.mark.parametrize("where", ["first-batch", "epoch-1-end"])
def test_the_run_of_a_bare_callback_whose_fit_raised_ends_failed_at_exit(tmp_path, mlflow_server, client, where):
    """Raised in the first batch (the process exits before the sender would start on its own: START_AFTER_S) or at
    the end of epoch 1 (the run is open by then): a FAILED run with every epoch that ended, the journal delivered."""
    name = f"bare-exit-{uuid.uuid4().hex[:8]}"
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_EXPERIMENT_NAME": name}
    done = launch.run(tmp_path, ["--explicit-callback", "--epochs", "4", "--raise-at", where], env=env,
                      horovodrun=False)  # fmt: skip
    assert done.returncode != 0 and f"RuntimeError: boom at {where}" in done.output, done.output[-3000:]
    [run] = runs_of(client, name)
    assert run.info.status == "FAILED"
    local = done.rank(0)["local"]  # Keras' own epoch logs, one per epoch that ended
    assert len(local) == (0 if where == "first-batch" else 2)
    loss = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in loss] == [(e, pytest.approx(v["loss"])) for e, v in enumerate(local)]
    assert run.data.params["epochs"] == "4"
    assert done.output.count(ENDED) == 1, done.output[-3000:]
    assert journals(tmp_path) == []  # delivered: nothing left for sync


def test_with_the_server_down_the_exit_is_bounded_and_sync_ends_the_run_failed(tmp_path, mlflow_server, client):
    name = f"bare-exit-down-{uuid.uuid4().hex[:8]}"
    env = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", "MLFLOW_EXPERIMENT_NAME": name,  # nothing listens there
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "HVD_MLFLOW_FLUSH_TIMEOUT": "60"}  # fmt: skip
    done = launch.run(tmp_path, ["--explicit-callback", "--epochs", "4", "--raise-at", "epoch-1-end"], env=env,
                      horovodrun=False)  # fmt: skip
    exited = time.time()
    assert done.returncode != 0 and "RuntimeError: boom at epoch-1-end" in done.output, done.output[-3000:]
    # the server is known down after three refused uploads (1 + 2 s of backoff), then 3 s of grace: not flush_timeout
    assert exited - done.rank(0)["raised_at"] < 30, exited - done.rank(0)["raised_at"]
    [journal] = journals(tmp_path)
    assert done.output.count(ENDED) == 1
    where = journal.relative_to(tmp_path)  # as the training's working directory names it
    said = f"(the server does not answer). They are kept in {where}; upload them with:  hvd-mlflow sync {where}"
    assert said in done.output, done.output[-3000:]
    synced = sync(tmp_path, "--tracking-uri", mlflow_server.url)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    [run] = runs_of(client, name)
    assert run.info.status == "FAILED"
    local = done.rank(0)["local"]
    loss = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in loss] == [(e, pytest.approx(v["loss"])) for e, v in enumerate(local)]
    assert len(local) == 2


def test_a_cut_fit_whose_callback_was_collected_still_ends_failed_at_exit(tmp_path, mlflow_server, client):
    """The script catches the error of a bare callback's fit (created inside ``callbacks=[...]``), keeps no reference
    to the callback, and the garbage collector takes it before the process exits normally: the run still ends
    FAILED at exit with every epoch that ended (the exit hook holds the fit's run logger, never the callback or its
    model). It stayed RUNNING, silently (README: "at the latest when the process exits")."""
    name = f"bare-exit-gc-{uuid.uuid4().hex[:8]}"
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_EXPERIMENT_NAME": name}
    done = launch.run(tmp_path, ["--explicit-callback", "--epochs", "4", "--raise-at", "epoch-1-end",
                                 "--catch-and-collect"], env=env, horovodrun=False)  # fmt: skip
    assert done.returncode == 0, done.output[-3000:]
    assert done.rank(0)["callback_collected"] == [True]  # the case under test: no callback left at exit
    [run] = runs_of(client, name)
    assert run.info.status == "FAILED"
    local = done.rank(0)["local"]
    assert len(local) == 2
    loss = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in loss] == [(e, pytest.approx(v["loss"])) for e, v in enumerate(local)]
    assert done.output.count(ENDED) == 1, done.output[-3000:]
    assert journals(tmp_path) == []
