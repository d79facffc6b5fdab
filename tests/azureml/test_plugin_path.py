"""The real azureml-mlflow plugin, offline: 2 real Horovod ranks in an AzureML-like job environment, talking
HTTPS to a faithful AzureML front (tests/support/azureml_front.py) in front of a real mlflow server."""

from __future__ import annotations

import uuid

import pytest

from tests.support import launch
from tests.support.azureml_front import AzureMLFront
from tests.support.checks import FAST_RETRIES, check_run, report
from tests.support.proxy import DROP_RESPONSE, Delay, Respond

pytestmark = [pytest.mark.multirank, pytest.mark.shared, pytest.mark.azureml, pytest.mark.timeout(600)]

LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def job(client, front: AzureMLFront, tmp_path, args: list[str], **extra: str):
    name = f"azureml-job-{uuid.uuid4().hex[:8]}"
    experiment_id = client.create_experiment(name, artifact_location=front.artifact_location(name))
    run_id = client.create_run(experiment_id).info.run_id  # the control plane creates the job's run
    env = {**FAST_RETRIES, **front.job_environment(run_id, experiment_id), **extra}
    done = launch.run(tmp_path, args, env=env, timeout=400).check()
    return run_id, [done.rank(0), done.rank(1)], done


@pytest.fixture
def front(mlflow_server, tmp_path):
    with AzureMLFront(mlflow_server.url, tmp_path / "tls") as front:
        yield front


def test_job_logs_global_values_from_rank0_only_through_the_plugin(tmp_path, client, front):
    epochs = 4
    run_id, ranks, done = job(client, front, tmp_path, ["--epochs", str(epochs), "--audit", "--stray-writers"])
    # every request was authenticated as AzureML requires, from loopback
    assert front.rejected == []
    assert front.requests and all(r.client == "127.0.0.1" for r in front.requests)
    assert all(r.headers["Authorization"].startswith("Bearer ey") for r in front.requests)
    assert all("azureml-mlflow/" in r.headers["User-Agent"] for r in front.requests)
    # each process connected and looked up loopback only; rank 1 never connected to the tracking server
    for r in ranks:
        assert {host for host, _ in r["connects"]} <= LOOPBACK, r["connects"]
        assert set(r["lookups"]) <= LOOPBACK, r["lookups"]
    assert not [c for c in ranks[1]["connects"] if c[1] == front.port]
    # the plugin's token-refresh thread runs on rank 0 only; rank 1 runs no thread of MLflow's or ours
    assert ranks[0]["token_refresh_daemon"] and not ranks[1]["token_refresh_daemon"]
    assert ranks[1]["threads"] == ["MainThread"]
    # global values, steps 0..E-1, every point once, even with mlflow.log_metric and mlflow.tensorflow.autolog
    # called on every rank (rank 1's were made no-ops, rank 0's autolog does not log epoch metrics)
    user_metric = {"user_metric": [float(e) for e in range(epochs)]}  # rank 0's own values only
    counts = check_run(client, run_id, ranks, epochs, extra_keys=user_metric)
    keras_keys = set(ranks[0]["local"][0])
    batches = [r for r in front.log_batches() if any(m["key"] in keras_keys for m in r.metrics)]
    assert 1 <= len(batches) <= epochs
    assert "mlflow.log_metric() on rank 1 does nothing" in done.output
    # the job's run is AzureML's: never ended, renamed or re-pointed
    assert not [r for r in front.requests if r.path.endswith(("/runs/update", "/runs/create", "/experiments/create"))]
    assert client.get_run(run_id).info.status == "RUNNING"
    # hvd-mlflow's own tags in a job: the 5 of every run, never journal_id (README, reference.md, azureml.md)
    tags = client.get_run(run_id).data.tags
    assert {k for k in tags if k.startswith("hvd_mlflow.")} == {
        f"hvd_mlflow.{name}" for name in ("engine", "world_size", "reduction", "keras_flavour", "hosts")
    }, tags
    assert tags["hvd_mlflow.engine"] == "horovod"
    report("azureml_plugin_path", requests=len(front.requests), metric_requests_with_keras_keys=len(batches),
           rank1_connections_to_tracking=0, **counts)  # fmt: skip


@pytest.mark.once
def test_throttling_is_survived_with_nothing_lost(tmp_path, client, front):
    count = {"n": 0, "429": 0}

    def every_other_429(request):
        count["n"] += 1
        if count["n"] % 2 == 0:
            count["429"] += 1
            return Respond(429, {"Retry-After": "1"}, b'{"error_code": "REQUEST_LIMIT_EXCEEDED"}')
        return None

    front.fault = every_other_429
    run_id, ranks, _ = job(client, front, tmp_path, ["--epochs", "5", "--epoch-sleep", "0.3"])
    assert count["429"] >= 2
    counts = check_run(client, run_id, ranks, 5)
    report("azureml_429", answered_429=count["429"], **counts)


@pytest.mark.once
def test_a_sender_far_behind_never_trips_the_250_values_limit(tmp_path, client, front):
    """300 one-step epochs against a front that takes 1 s per request: the sender packs epochs, but never more
    than 250 values of a key into one request (AzureML would answer 400)."""
    front.fault = lambda request: Delay(1.0) if request.is_log_batch else None
    epochs = 300
    run_id, ranks, _ = job(client, front, tmp_path, ["--epochs", str(epochs), "--samples", "16", "--no-validation"])
    statuses = [r.status for r in front.log_batches()]
    assert 400 not in statuses
    per_request = [len({m["step"] for m in r.metrics}) for r in front.log_batches() if r.metrics]
    assert max(per_request) > 1 and max(per_request) <= 250  # packed, within the limit
    counts = check_run(client, run_id, ranks, epochs)
    report("azureml_250_limit", epochs=epochs, requests=len(per_request), max_epochs_per_request=max(per_request),
           **counts)  # fmt: skip


def test_model_as_artifacts_and_params_over_200_in_an_artifact(tmp_path, client, front):
    """log_models=True in a job: the model lands as artifacts through AzureML's artifact service (no
    logged-models request); 300 params: 200 stay params (AzureML's limit), the rest go to a JSON artifact."""
    import json

    import numpy as np

    run_id, ranks, done = job(client, front, tmp_path, ["--epochs", "2", "--params", "300", "--probe"],
                              HVD_MLFLOW_LOG_MODELS="1")  # fmt: skip
    assert front.rejected == []
    assert not [r for r in front.requests if "logged-models" in r.path]
    blobs = front.artifact_dir / f"dcid.{run_id}"
    files = sorted(str(p.relative_to(blobs)) for p in blobs.rglob("*") if p.is_file())
    assert "model/saved_model/saved_model.pb" in files, files
    # the uploaded SavedModel is the trained model: it predicts what rank 0's model predicted
    import tensorflow as tf

    loaded = tf.saved_model.load(str(blobs / "model" / "saved_model"))
    probe = np.asarray(ranks[0]["probe_x"], dtype="float32")
    serve = loaded.signatures["serving_default"]
    predicted = next(iter(serve(tf.constant(probe)).values())).numpy().ravel()
    assert predicted == pytest.approx(np.asarray(ranks[0]["probe_y"]).ravel(), rel=1e-5, abs=1e-6)
    # params: 200 in the run, the other 100 (all extra hyperparameters) in the artifact, none lost
    params = client.get_run(run_id).data.params
    assert len(params) == 200
    [overflow_file] = [blobs / f for f in files if f.startswith("hvd_mlflow/params-")]
    overflow = json.loads(overflow_file.read_text())
    hp = {k: v for k, v in {**params, **overflow}.items() if k.startswith("hp_")}
    assert hp == {f"hp_{i:03d}": str(i) for i in range(300)}
    assert "at most 200 params per run" in done.output
    assert client.get_run(run_id).info.status == "RUNNING"
    report("azureml_models_params", files=len(files), params=len(params), params_in_artifact=len(overflow))


def test_an_artifact_whose_answer_was_lost_is_delivered_once(tmp_path, client, front):
    """azureml.md's limits table: "a 409 after a resend counts as delivered". The blob of the params artifact is
    written and its answer lost: the upload never returns, so the end of fit is bounded and leaves what waited behind
    it in the journal (kept in ./outputs). ``sync`` resends it: AzureML never overwrites (409), and that counts as
    delivered: every param once, in the run or in the artifact; nothing refused, nothing left."""
    import json

    from tests.support.checks import sync

    lost = []

    def lose_the_params_artifacts_answer(request):
        if "hvd_mlflow/params-" in request.path and not lost:
            lost.append(request.path)
            return DROP_RESPONSE
        return None

    front.fault = lose_the_params_artifacts_answer
    job_dir = tmp_path / "job"
    run_id, ranks, done = job(client, front, job_dir, ["--epochs", "2", "--params", "300"],
                              HVD_MLFLOW_FLUSH_TIMEOUT="8")  # fmt: skip
    assert lost and "were not delivered" in done.output, done.output[-3000:]
    [kept] = (job_dir / "outputs" / "hvd_mlflow_journal").glob("*.journal.sqlite")
    front.fault = None
    synced = sync(tmp_path, str(kept), env=front.job_environment(run_id, client.get_run(run_id).info.experiment_id))
    assert synced.returncode == 0 and "refused" not in synced.stdout + synced.stderr, synced.stdout + synced.stderr
    # the blob written once, its answer lost; sync's resend asks the artifact service again, which answers 409
    # (the artifact exists): counted as delivered, never written twice
    puts = [r.status for r in front.requests if "hvd_mlflow/params-" in r.path.split("?")[0]]
    asked = [r.status for r in front.requests if b"hvd_mlflow/params-" in r.body and "/history/" in r.path]
    assert puts == [0] and asked[0] == 200 and asked[1:] == [409], (puts, asked)
    blobs = front.artifact_dir / f"dcid.{run_id}"
    [overflow_file] = list((blobs / "hvd_mlflow").glob("params-*"))
    params = client.get_run(run_id).data.params
    overflow = json.loads(overflow_file.read_text())
    assert {k: v for k, v in {**params, **overflow}.items() if k.startswith("hp_")} == {
        f"hp_{i:03d}": str(i) for i in range(300)
    }
    assert not kept.exists()  # delivered: sync deleted it
    check_run(client, run_id, ranks, 2)  # and every epoch, once


@pytest.mark.once
def test_doctor_in_a_job_says_the_plugin_job_mode_and_the_runs_limits(tmp_path, client, front):
    """reference.md's `doctor`, azureml.md (limits, job mode), troubleshooting.md: in an AzureML job's environment the
    doctor says the plugin is used, that this is a job (it logs into the job's run), and the per-run budget that
    applies: AzureML's, or the user's when set."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.support.environment import clean_environment

    experiment_id = client.create_experiment(f"doctor-{uuid.uuid4().hex[:8]}")
    run_id = client.create_run(experiment_id).info.run_id
    env = {**clean_environment(), **front.job_environment(run_id, experiment_id), "TF_CPP_MIN_LOG_LEVEL": "3"}
    doctor = [str(Path(sys.executable).parent / "hvd-mlflow"), "doctor"]

    def line(out: str, name: str) -> str:
        [found] = [row for row in out.splitlines() if row[3:].startswith(name)]
        return found

    done = subprocess.run(doctor, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert line(done.stdout, "azureml plugin").split(None, 3)[-1] == "1.62.0.post6; used", done.stdout
    assert "yes: logs into the job's run, never creates or ends runs" in line(done.stdout, "AzureML job mode")
    assert "50 metric names per run, 1,000,000 rows per metric, 50 tags" in line(done.stdout, "per-run limits")
    env["HVD_MLFLOW_MAX_METRIC_NAMES"] = "30"
    done = subprocess.run(doctor, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert "30 metric names per run" in line(done.stdout, "per-run limits"), done.stdout
