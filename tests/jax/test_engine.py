"""The ``keras.distribution`` engine: two JAX processes on this machine (Keras 3's JAX backend, no TensorFlow),
launched the three ways users launch them, each process pointed at a counting proxy of its own in front of the real
``mlflow server``.

The truths are independent of hvd-mlflow: a one-process ``model.evaluate`` of the same weights on the union of both
processes' data (tests/workers/jax_worker.py's ``truth``: learning rate 0, so every epoch's and every batch's values
are those weights' metrics on the data seen so far), each process's own callbacks' view (a callback after
hvd-mlflow's), the tracking server's store, and the proxies' record of who sent what.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.checks import report
from tests.support.environment import clean_environment
from tests.support.mlflow_server import free_port
from tests.support.proxy import Proxy

pytestmark = [pytest.mark.jax, pytest.mark.alone, pytest.mark.timeout(600)]
WORKER = Path(__file__).resolve().parent.parent / "workers" / "jax_worker.py"
REPO = WORKER.parent.parent.parent
EPOCHS = 2
SCENARIOS = ("weighted", "multi_output")


def environment(url: str, out: Path, **extra: str) -> dict[str, str]:
    return clean_environment(
        MLFLOW_TRACKING_URI=url, HVD_MLFLOW_TESTING="1", HVD_MLFLOW_LOG_MODELS="0", KERAS_BACKEND="jax",
        HVD_MLFLOW_JOURNAL_DIR=str(out / "journal"), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **extra,
    )  # fmt: skip


def launch(mode: str, out: Path, urls: list[str], args: list[str], per_process: list[list[str]] | None = None,
           env: dict[str, str] | None = None):  # fmt: skip
    """Two processes of jax_worker.py, started as ``mode`` says; each one's (return code, output)."""
    per_process, env = per_process or [[], []], env or {}
    command = [sys.executable, str(WORKER), "--launch", mode, "--out", str(out), *args]
    if mode == "mpirun":  # one app context per process: each its own tracking address (rank order = context order)
        contexts: list[str] = []
        for i in (0, 1):
            contexts += [":"] if i else []
            contexts += ["-np", "1", "env", f"MLFLOW_TRACKING_URI={urls[i]}", *command, *per_process[i]]
        mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", *contexts]
        done = subprocess.run(mpirun, env=environment(urls[0], out, **env), cwd=out, capture_output=True, text=True,
                              timeout=400)  # fmt: skip
        return [(done.returncode, done.stdout + done.stderr)] * 2
    port = free_port()
    processes = []
    for i in (0, 1):
        extra = dict(env)
        argv = [*command, *per_process[i]]
        if mode == "explicit":
            argv += ["--coordinator", f"127.0.0.1:{port}", "--process-id", str(i)]
        else:  # the KERAS_DISTRIBUTION_* variables, as keras-io's distribution guide sets them
            extra |= {"KERAS_DISTRIBUTION_JOB_ADDRESSES": f"127.0.0.1:{port}", "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
                     "KERAS_DISTRIBUTION_PROCESS_ID": str(i)}  # fmt: skip
        processes.append(subprocess.Popen(argv, env=environment(urls[i], out, **extra), cwd=out, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))  # fmt: skip
    results = []
    for process in processes:
        try:
            output, _ = process.communicate(timeout=400)
        except subprocess.TimeoutExpired:
            for p in processes:
                p.kill()
            raise
        results.append((process.returncode, output))
    return results


def records(out: Path) -> list[dict]:
    return [json.loads((out / f"process{i}.json").read_text()) for i in (0, 1)]


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def job(tmp_path_factory, mlflow_server):
    """The conformance job: explicit addresses, both scenarios, a run created for each."""
    from mlflow import MlflowClient

    client, out = MlflowClient(mlflow_server.url), tmp_path_factory.mktemp("jax-engine")
    experiment = client.create_experiment(f"jax-{uuid.uuid4().hex[:8]}")
    runs = {name: client.create_run(experiment).info.run_id for name in SCENARIOS}
    with Proxy(mlflow_server.url) as first, Proxy(mlflow_server.url) as second:
        args = ["--scenarios", ",".join(SCENARIOS), "--epochs", str(EPOCHS),
                "--runs", ",".join(f"{k}={v}" for k, v in runs.items())]  # fmt: skip
        results = launch("explicit", out, [first.url, second.url], args)
        requests = [list(first.requests), list(second.requests)]
    for code, output in results:
        assert code == 0, output[-5000:]
    done = subprocess.run([sys.executable, str(WORKER), "--truth", str(out), str(EPOCHS), *SCENARIOS],
                          env=environment("http://127.0.0.1:9", out), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    truths = json.loads(done.stdout.strip().splitlines()[-1])
    return runs, records(out), truths, requests, results


def test_every_value_equals_one_process_on_the_union_of_both_processes_data(job, client):
    """Keras' values under keras.distribution are global already: the run holds them unchanged, one point per
    epoch, and they equal one process's evaluation on both processes' samples (AUC, precision, recall, a weighted
    metric, sample weights, a custom max metric, two heads). Nothing is summed twice."""
    runs, processes, truths, _, _ = job
    worst: dict[str, float] = {}
    for name in SCENARIOS:
        seen = [{k: p["scenarios"][name][k] for k in ("batches", "epochs")} for p in processes]
        assert seen[0] == seen[1], name  # every process's later callbacks saw the same values
        truth = truths[name]["epoch"]
        assert len(truth) >= 12, truth
        for key, expected in truth.items():
            points = history(client, runs[name], key)
            assert [s for s, _ in points] == list(range(EPOCHS)), (name, key, points)
            for step, value in points:
                assert value == seen[0]["epochs"][step][key], (name, key)  # Keras' value, unchanged
                assert value == pytest.approx(expected, rel=2e-6, abs=1e-7), (name, key, step)
                error = abs(value - expected) / max(abs(expected), 1e-12)
                worst[f"{name}/{key}"] = max(worst.get(f"{name}/{key}", 0.0), error)
    report("jax-engine-conformance", worst_relative_error=worst, max=max(worst.values()))


def test_batch_curves_are_the_global_running_values(job, client):
    """log_every_n_steps=1: each batch point is Keras' running value over the global batches so far, the value
    one process computes on both processes' first batches together; at the optimizer's steps 1.. (3 per epoch)."""
    runs, processes, truths, _, _ = job
    for name in SCENARIOS:
        truth = truths[name]["batches"]
        seen = processes[0]["scenarios"][name]["batches"]
        assert len(seen) == len(truth) == 3 * EPOCHS
        for key in truth[0]:
            points = history(client, runs[name], f"batch/{key}")
            assert [s for s, _ in points] == list(range(1, 3 * EPOCHS + 1)), (name, key, points)
            assert [v for _, v in points] == [b[key] for b in seen], (name, key)
            assert [v for _, v in points] == pytest.approx([b[key] for b in truth], rel=2e-6, abs=1e-7), key


def test_process_0_alone_sends_and_the_others_calls_are_stood_in_for(job, client):
    """Requests by process: the second process's proxy saw none, though it ran the user's mlflow.start_run and
    log_metric too; the run holds process 0's user metric once, and the engine's tags."""
    runs, _, _, requests, results = job
    assert requests[1] == [], [r.path for r in requests[1]][:10]
    assert any(r.is_log_batch for r in requests[0])
    for name, run_id in runs.items():
        assert history(client, run_id, "user_metric") == [(0, 10.0)], name  # process 0's value, once
        run = client.get_run(run_id)
        tags = {k: v for k, v in run.data.tags.items() if k.startswith("hvd_mlflow.")}
        assert tags["hvd_mlflow.engine"] == "keras.distribution" and tags["hvd_mlflow.world_size"] == "2"
        assert tags["hvd_mlflow.reduction"] == "global batch"  # nothing reduced: Keras' own global values
        assert run.data.params["world_size"] == "2" and run.data.params["batch_size"] == "16"
        assert run.data.params["global_batch_size"] == "32"
        for key in ("epoch_time_s", "samples_per_s", "loss", "val_loss"):
            assert [s for s, _ in history(client, run_id, key)] == list(range(EPOCHS)), key  # one point per epoch
        [(_, samples), *_] = history(client, run_id, "samples_per_s")
        [(_, seconds), *_] = history(client, run_id, "epoch_time_s")
        assert samples * seconds == pytest.approx(96, rel=1e-6)  # both processes' 48 training samples
    assert "only rank 0 writes" in results[1][1]  # the stand-in said so on process 1
    report("jax-engine-requests", by_process=[len(r) for r in requests])


@pytest.mark.parametrize("mode", ["env", "mpirun"])
def test_launched_with_the_variables_or_by_mpirun_it_logs_one_run_from_process_0(mode, tmp_path, mlflow_server,
                                                                                   client):  # fmt: skip
    """``keras.distribution.initialize()`` with no arguments: from the KERAS_DISTRIBUTION_* variables, or from Open
    MPI's own variables under mpirun (JAX's detection, as AzureML's type: mpi starts processes). Both processes join
    one world of 2; process 0 alone writes one point per epoch, each the value both processes saw. System metrics
    (on) travel in the epoch's collective: each epoch's memory minimum and maximum over the processes bracket what
    each process read of itself at that epoch's end."""
    run_id = client.create_run("0").info.run_id
    with Proxy(mlflow_server.url) as first, Proxy(mlflow_server.url) as second:
        results = launch(mode, tmp_path, [first.url, second.url], ["--runs", f"small={run_id}", "--epochs", "2",
                         "--pause", "0.3"], env={"HVD_MLFLOW_SYSTEM_METRICS": "1"})  # fmt: skip
        requests = [list(first.requests), list(second.requests)]
    for code, output in results:
        assert code == 0, output[-5000:]
    processes = records(tmp_path)
    assert [(p["process"], p["processes"]) for p in processes] == [(0, 2), (1, 2)]
    seen = [p["scenarios"]["small"]["epochs"] for p in processes]
    assert seen[0] == seen[1]
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert history(client, run_id, key) == [(e, seen[0][e][key]) for e in range(2)], key
    assert requests[1] == [] and any(r.is_log_batch for r in requests[0])
    assert client.get_run(run_id).data.tags["hvd_mlflow.engine"] == "keras.distribution"
    rss = [p["scenarios"]["small"]["rss_mb"] for p in processes]
    low, high = history(client, run_id, "system/rss_mb_min"), history(client, run_id, "system/rss_mb_max")
    assert [s for s, _ in low] == [s for s, _ in high] == [0, 1]
    for epoch in (0, 1):
        own = [rss[0][epoch], rss[1][epoch]]
        assert low[epoch][1] <= min(own) * 1.05 and high[epoch][1] >= max(own) * 0.95, (low, high, own)
        assert 50 < low[epoch][1] <= high[epoch][1] < 4000
    assert {v for _, v in history(client, run_id, "system/rss_mb_max_rank")} <= {0.0, 1.0}
    report(f"jax-launch-{mode}", by_process=[len(r) for r in requests])


def test_processes_with_different_batches_are_refused_on_every_process(tmp_path, mlflow_server, client):
    """48 training samples on process 0, 40 on process 1 (batches of 16: the last ones 16 and 8). JAX cannot join
    them: without hvd-mlflow each process silently computes other values for the last batch (their logs differ).
    Every process raises the same one-line ShardMismatchError at train begin, naming each one's samples; nothing is
    logged."""
    run_id = client.create_run("0").info.run_id
    results = launch("explicit", tmp_path, [mlflow_server.url] * 2, ["--runs", f"small={run_id}", "--epochs", "1"],
                     per_process=[[], ["--train", "40"]])  # fmt: skip
    for code, output in results:
        assert code != 0, output[-3000:]
        assert "ShardMismatchError: hvd-mlflow: keras.distribution joins every process's" in output, output[-3000:]
        assert "process 0: training 48, validation 24, batch size 16, validation batch size 16, steps 3" in output
        assert "process 1: training 40, validation 24, batch size 16, validation batch size 16, steps 3" in output
    assert client.get_metric_history(run_id, "loss") == []
    assert os.path.exists(tmp_path) and not list(tmp_path.glob("process*.json"))


@pytest.mark.parametrize("mode", ["mpirun", "no-distribution", "auto-shard"])
def test_processes_that_keras_distribution_does_not_join_are_refused_on_every_process(mode, tmp_path, mlflow_server,
                                                                                      client):  # fmt: skip
    """Two processes that would each train alone and log as rank 0 into one run: started by mpirun with no
    ``initialize()``, or initialised with no distribution set: every process refuses at fit's start, in one line
    that names the fix. Arrays with Keras' ``auto_shard_dataset`` left on (it shards only tf.data datasets): Keras'
    own error, on every process. The run gets nothing."""
    run_id = client.create_run("0").info.run_id
    args = ["--runs", f"small={run_id}", "--epochs", "1"]
    if mode == "mpirun":
        results = launch("mpirun", tmp_path, [mlflow_server.url] * 2, args, per_process=[["--launch", "none"]] * 2)
        expected = ["LauncherMismatchError: hvd-mlflow: Open MPI's mpirun started 2 processes"]
    elif mode == "no-distribution":
        results = launch("explicit", tmp_path, [mlflow_server.url] * 2, [*args, "--no-distribution"])
        expected = ["LauncherMismatchError: hvd-mlflow: JAX runs 2 processes (keras.distribution.initialize())"]
    else:
        results = launch("explicit", tmp_path, [mlflow_server.url] * 2, [*args, "--auto-shard"])
        expected = ["ValueError: When using a multi-worker distribution with auto-sharding enabled"]
    for code, output in results:
        assert code != 0 and all(line in output for line in expected), output[-3000:]
    if mode == "mpirun":  # each of the two processes said it
        assert results[0][1].count(expected[0]) == 2, results[0][1][-3000:]
    assert client.get_metric_history(run_id, "loss") == []


def test_processes_allowed_to_train_alone_each_log_as_one_process(tmp_path, mlflow_server, client):
    """``allow_world_of_one``: JAX processes initialised with no distribution, each meant to train alone, each log as
    a world of one into their own run (before, the keras.distribution engine was chosen anyway: the run said
    "global batch" for values that were each process's own, and uneven data would have been refused)."""
    runs = [client.create_run("0").info.run_id for _ in (0, 1)]
    results = launch("explicit", tmp_path, [mlflow_server.url] * 2, ["--epochs", "1", "--no-distribution"],
                     per_process=[["--runs", f"small={runs[0]}"], ["--runs", f"small={runs[1]}", "--train", "40"]],
                     env={"HVD_MLFLOW_ALLOW_WORLD_OF_ONE": "1"})  # fmt: skip
    for code, output in results:
        assert code == 0, output[-3000:]
    processes = records(tmp_path)
    for process, run_id in zip(processes, runs, strict=True):
        run = client.get_run(run_id)
        assert run.data.tags["hvd_mlflow.engine"] == "single process" and run.data.params["world_size"] == "1"
        assert [v for _, v in history(client, run_id, "loss")] == [process["scenarios"]["small"]["epochs"][0]["loss"]]
    assert processes[0]["scenarios"]["small"]["epochs"] != processes[1]["scenarios"]["small"]["epochs"]  # their own
