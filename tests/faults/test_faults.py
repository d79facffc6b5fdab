"""Fault injection: real ranks, a real mlflow server, a faulty proxy between them.

Every case asserts: fit finished on every rank, the run holds every epoch exactly once for every metric with
the global value (after ``hvd-mlflow sync`` where the case needs it), and the longest time hvd-mlflow added
to an epoch end on rank 0 stays under STALL_BOUND_S. Measurements go to test-artifacts/faults/.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid

import pytest

from hvd_mlflow.delivery.sender import DOWN_GRACE_S
from tests.support.checks import (
    FAST_RETRIES,
    STALL_BOUND_S,
    check_run,
    journals,
    launch,
    longest_stall,
    report,
    sync,
)
from tests.support.mlflow_server import free_port
from tests.support.proxy import DROP_RESPONSE, RESET, Delay, Proxy, Recorded, Respond

pytestmark = [pytest.mark.multirank, pytest.mark.faults, pytest.mark.timeout(600)]


def precreated_run(client) -> str:
    experiment = client.create_experiment(f"faults-{uuid.uuid4().hex[:8]}")
    return client.create_run(experiment).info.run_id


def train(tmp_path, uri: str, run_id: str | None = None, args: list[str] | None = None, **env: str):
    environment = {**FAST_RETRIES, "MLFLOW_TRACKING_URI": uri, **env}
    if run_id:
        environment["MLFLOW_RUN_ID"] = run_id
    return launch.run(tmp_path, args or [], env=environment, timeout=400)


def finished_ranks(done) -> list[dict]:
    done.check()
    ranks = [done.rank(0), done.rank(1)]
    assert all(r.get("finished") for r in ranks)
    return ranks


def assert_stall(name: str, ranks: list[dict], counts: dict, **extra) -> None:
    stall = longest_stall(ranks[0])
    report(name, longest_epoch_end_stall_s=round(stall, 4), train_begin_s=ranks[0].get("train_begin_s"),
           train_end_s=ranks[0].get("train_end_s"), **counts, **extra)  # fmt: skip
    assert stall < STALL_BOUND_S, stall


def test_server_unreachable_from_the_start_then_sync(tmp_path, mlflow_server, client):
    port = free_port()  # nothing listens there during training
    name = f"unreachable-{uuid.uuid4().hex[:8]}"
    done = train(tmp_path, f"http://127.0.0.1:{port}", args=["--epochs", "4"],
                 MLFLOW_EXPERIMENT_NAME=name, HVD_MLFLOW_FLUSH_TIMEOUT="3")  # fmt: skip
    ranks = finished_ranks(done)
    assert "were not delivered" in done.output and "hvd-mlflow sync" in done.output
    assert len(journals(tmp_path)) == 1
    with Proxy(mlflow_server.url, port=port):  # the server is back, at the same address
        first = sync(tmp_path)
        assert first.returncode == 0, first.stderr
        again = sync(tmp_path)
        assert again.returncode == 0 and "nothing to upload" in again.stdout
    [run] = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    assert run.info.status == "FINISHED"
    counts = check_run(client, run.info.run_id, ranks, 4)
    assert journals(tmp_path) == []
    assert_stall("unreachable_then_sync", ranks, counts, syncs=2)


def at_metrics_request(n: int, act) -> tuple:
    """A fault that calls ``act()`` at the ``n``-th request carrying metrics and cuts that request's connection; and
    what it saw (``metric_requests``, ``acted``: what ``act`` returned)."""
    seen: dict = {"metric_requests": 0}

    def fault(request: Recorded):
        if request.metrics:
            seen["metric_requests"] += 1
            if seen["metric_requests"] == n:
                seen["acted"] = act()
                return RESET
        return None

    return fault, seen


def test_server_killed_mid_training_and_restarted(tmp_path, mlflow_server, client):
    run_id = precreated_run(client)
    proxy: Proxy
    fault, seen = at_metrics_request(2, lambda: proxy.outage(4.0))  # down for 4 s, then back on the same port
    with Proxy(mlflow_server.url, fault=fault) as proxy:
        # 12 epochs of at least 0.5 s: the server is back while the training runs (the premise: with 8, a row whose
        # epochs are fast ended its fit inside the outage, and rightly left the last epochs in the journal)
        done = train(tmp_path, proxy.url, run_id, ["--epochs", "12", "--epoch-sleep", "0.5"])
        ranks = finished_ranks(done)
    assert "acted" in seen
    assert "were not delivered" not in done.output, done.output[-3000:]
    counts = check_run(client, run_id, ranks, 12)
    assert_stall("server_killed_and_restarted", ranks, counts, outage_s=4.0)


def test_429_with_retry_after_on_half_the_requests(tmp_path, mlflow_server, client):
    run_id = precreated_run(client)
    count = {"n": 0, "429": 0}

    def fault(request: Recorded):
        count["n"] += 1
        if count["n"] % 2 == 0:
            count["429"] += 1
            return Respond(429, {"Retry-After": "1"}, b'{"error_code": "REQUEST_LIMIT_EXCEEDED"}')
        return None

    with Proxy(mlflow_server.url, fault=fault) as proxy:
        ranks = finished_ranks(train(tmp_path, proxy.url, run_id, ["--epochs", "6", "--epoch-sleep", "0.3"]))
    assert count["429"] >= 2  # half of the requests; the sender packs epochs, so there are few requests
    counts = check_run(client, run_id, ranks, 6)
    assert_stall("throttled_429", ranks, counts, answered_429=count["429"], requests=count["n"])


def test_random_503s_and_connection_resets(tmp_path, mlflow_server, client):
    run_id = precreated_run(client)
    rng = random.Random(1234)
    injected = {"503": 0, "reset": 0}
    count = {"n": 0}
    lock = threading.Lock()

    def fault(request: Recorded):
        with lock:
            draw = rng.random()
            count["n"] += 1
            n = count["n"]
        if n == 2:  # at least one of each, whatever the draws
            draw = 0.3
        if n == 3:
            draw = 0.1
        if draw < 0.25:
            injected["503"] += 1
            return Respond(503)
        if draw < 0.40:
            injected["reset"] += 1
            return RESET
        return None

    with Proxy(mlflow_server.url, fault=fault) as proxy:
        ranks = finished_ranks(train(tmp_path, proxy.url, run_id, ["--epochs", "6", "--epoch-sleep", "0.3"]))
    assert injected["503"] and injected["reset"]
    counts = check_run(client, run_id, ranks, 6)
    assert_stall("random_503_and_resets", ranks, counts, **injected)


def test_applied_request_whose_response_is_lost_is_not_sent_twice(tmp_path, mlflow_server, client):
    """The server applies the epoch-1 request but no answer ever comes back, through all of MLflow's retries.
    hvd-mlflow then checks the run before sending again, sees the points and does not resend them."""
    run_id = precreated_run(client)
    dropped = []

    def fault(request: Recorded):
        if any(m["step"] in (1, "1") for m in request.metrics) and len(dropped) < 3:
            dropped.append(request)
            return DROP_RESPONSE
        return None

    with Proxy(mlflow_server.url, fault=fault) as proxy:
        done = train(tmp_path, proxy.url, run_id, ["--epochs", "4", "--epoch-sleep", "0.3"])
        ranks = finished_ranks(done)
        sent_step1 = [r for r in proxy.log_batches() if any(str(m["step"]) == "1" for m in r.metrics)]
    assert len(dropped) == 3  # MLflow's own retries (2) resent it; all three applied, none answered
    assert "had been applied" in done.output
    assert len(sent_step1) == 3  # and hvd-mlflow did not send it a fourth time
    counts = check_run(client, run_id, ranks, 4)
    assert_stall("response_lost", ranks, counts, dropped_responses=len(dropped))


def test_slow_server(tmp_path, mlflow_server, client):
    run_id = precreated_run(client)
    with Proxy(mlflow_server.url, fault=lambda r: Delay(3.0)) as proxy:
        ranks = finished_ranks(train(tmp_path, proxy.url, run_id, ["--epochs", "6"]))
        requests = len(proxy.metric_requests())
    counts = check_run(client, run_id, ranks, 6)
    assert requests <= 6
    assert_stall("slow_server_3s", ranks, counts, metric_requests=requests)


def test_rank0_sigkilled_mid_training_then_sync(tmp_path, mlflow_server, client):
    name = f"killed-{uuid.uuid4().hex[:8]}"
    done = train(tmp_path, mlflow_server.url, args=["--epochs", "6", "--kill-rank0-at-epoch", "2",
                 "--epoch-sleep", "0.3"], MLFLOW_EXPERIMENT_NAME=name)  # fmt: skip
    assert done.returncode != 0
    ranks = [done.rank(0), done.rank(1)]
    assert len(ranks[0]["local"]) == 3  # epochs 0, 1, 2 were completed and journaled
    result = sync(tmp_path)
    assert result.returncode == 0, result.stderr
    [run] = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    assert run.info.status == "KILLED"
    counts = check_run(client, run.info.run_id, ranks, 3)
    assert_stall("rank0_sigkill_then_sync", ranks, counts)


def test_1500_metrics_300_params_and_odd_names(tmp_path, mlflow_server, client):
    run_id = precreated_run(client)
    args = ["--epochs", "3", "--extra-metrics", "1500", "--odd-names", "--params", "300"]
    with Proxy(mlflow_server.url) as proxy:
        done = train(tmp_path, proxy.url, run_id, args)
        ranks = finished_ranks(done)
        batches = [r.json() for r in proxy.log_batches()]
    extra = {f"extra/m{i:04d}": [i + 0.5 + e * 0.5 for e in range(3)] for i in range(1500)}
    cleaned = {"acc@5": "acc_5", "f(1)": "f_1_", "val loss": "val loss", "précision": "précision",
               "top 1/err": "top 1/err"}  # fmt: skip
    for j, (original, name) in enumerate(cleaned.items()):
        extra[name] = [j * 10 + 0.5 + e for e in range(3)]
        if name != original:
            assert done.output.count(f"{original!r} is not accepted") == 1
    counts = check_run(client, run_id, ranks, 3, extra_keys=extra)
    params = client.get_run(run_id).data.params
    assert all(params[f"hp_{i:03d}"] == str(i) for i in range(300))
    for body in batches:  # every request within MLflow's and AzureML's limits
        assert len(body.get("metrics", [])) <= 1000
        assert len(body.get("params", [])) + len(body.get("tags", [])) <= 100
        keys = [m["key"] for m in body.get("metrics", [])]
        assert all(keys.count(k) <= 250 for k in set(keys))
    assert_stall("1500_metrics_300_params", ranks, counts, requests=len(batches))


def test_names_that_collide_once_cleaned_fail_every_rank(tmp_path, mlflow_server):
    done = train(tmp_path, mlflow_server.url, args=["--epochs", "2", "--collision"])
    assert done.returncode != 0
    assert done.output.count("MetricNameCollisionError") >= 2
    assert "'a(b', 'a@b' -> 'a_b'" in done.output


def test_secrets_never_reach_logs_journal_or_run(tmp_path, mlflow_server, client):
    """Three secrets (a token, a password in the URI, a key in an unrelated variable) against the training's output,
    the journal files byte by byte (the database and its WAL), the sync's output and the run's params and tags."""
    token, password, api_key = (f"SECRET{uuid.uuid4().hex}" for _ in range(3))
    port = free_port()
    uri = f"http://alice:{password}@127.0.0.1:{port}"  # nothing listens during training
    name = f"secrets-{uuid.uuid4().hex[:8]}"
    env = {"MLFLOW_EXPERIMENT_NAME": name, "HVD_MLFLOW_FLUSH_TIMEOUT": "3", "MLFLOW_TRACKING_TOKEN": token,
           "MY_SERVICE_API_KEY": api_key}  # fmt: skip
    done = train(tmp_path, uri, args=["--epochs", "3"], **env)
    ranks = finished_ranks(done)
    [journal] = journals(tmp_path)
    assert oct(journal.stat().st_mode & 0o777) == oct(0o600)
    # the journal files themselves (the database and its WAL), byte by byte, before any sync touches them
    files = list((tmp_path / ".hvd_mlflow" / "journal").iterdir())
    assert files
    for path in files:
        data = path.read_bytes()
        for secret in (token, password, api_key):
            assert secret.encode() not in data, f"a secret is in the journal file {path.name}"
    refused = sync(tmp_path)  # the journal does not hold the password, so sync must be told the URI
    assert refused.returncode != 0 and "carried credentials" in refused.stderr
    with Proxy(mlflow_server.url, port=port):
        result = sync(tmp_path, env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_TRACKING_TOKEN": token})
    assert result.returncode == 0, result.stderr
    [run] = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    check_run(client, run.info.run_id, ranks, 3)
    texts = {
        "training output": done.output,
        "sync output": refused.stdout + refused.stderr + result.stdout + result.stderr,
        "run params and tags": repr(run.data.params) + repr(run.data.tags),
    }
    for name_, text in texts.items():
        for secret in (token, password, api_key):
            assert secret not in text, f"a secret leaked into the {name_}"
    assert "***@127.0.0.1" in done.output  # the URI is shown, masked
    report("secrets", places_checked=len(texts) + 1 + len(files), secrets=3, leaks=0)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_under_the_journal_moves_it_to_memory_and_loses_nothing(tmp_path, mlflow_server, client):
    """Rank 0's journal directory is a 256 KB filesystem that fills up mid-training (about 6 KB per epoch)."""
    small = tmp_path / "small-disk"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], check=True)
    try:
        run_id = precreated_run(client)
        done = train(tmp_path / "work", mlflow_server.url, run_id,
                     ["--epochs", "10", "--extra-metrics", "150", "--epoch-sleep", "0.1"],
                     HVD_MLFLOW_JOURNAL_DIR=str(small))  # fmt: skip
        ranks = finished_ranks(done)
        used = shutil.disk_usage(small)
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
    assert "cannot be written any more" in done.output and "database or disk is full" in done.output
    assert "Traceback" not in done.output
    extra = {f"extra/m{i:04d}": [i + 0.5 + e * 0.5 for e in range(10)] for i in range(150)}
    counts = check_run(client, run_id, ranks, 10, extra_keys=extra)
    assert_stall("disk_full", ranks, counts, disk_bytes=used.total, disk_free_at_end=used.free)


def test_a_server_down_for_the_whole_training_costs_it_seconds_not_minutes(tmp_path, mlflow_server, client):
    """Default settings (flush_timeout 60 s, MLflow's own retries, model logging on, a run to create): the same
    6-epoch training against a healthy server, then against an address where nothing ever answers."""
    names = {which: f"down-{which}-{uuid.uuid4().hex[:8]}" for which in ("healthy", "down")}
    defaults = {"HVD_MLFLOW_LOG_MODELS": "1"}
    healthy = launch.run(
        tmp_path / "healthy",
        ["--epochs", "6"],
        timeout=400,
        env={**defaults, "MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_EXPERIMENT_NAME": names["healthy"]},
    )
    healthy.check()
    port = free_port()
    down = launch.run(
        tmp_path / "down",
        ["--epochs", "6"],
        timeout=400,
        env={**defaults, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}", "MLFLOW_EXPERIMENT_NAME": names["down"]},
    )
    ranks = finished_ranks(down)
    extra = down.seconds - healthy.seconds
    assert "hvd-mlflow sync" in down.output and "the model was not logged" in down.output
    # From train begin to process exit (#33 item 11): train begin waits for nothing; rank 0's fit returns at most the
    # probe plus DOWN_GRACE_S after rank 1's (the model's wait for a run included); each process exits right after.
    exits = [json.loads((down.out_dir / f"exit{r}.json").read_text())["at"] for r in (0, 1)]
    fit_lag = ranks[0]["fit_returned_at"] - ranks[1]["fit_returned_at"]
    exit_lags = [round(at - rank["fit_returned_at"], 2) for at, rank in zip(exits, ranks, strict=True)]
    timeline = dict(train_begin_s=ranks[0]["train_begin_s"], fit_lag_s=round(fit_lag, 2), exit_lags_s=exit_lags)
    assert ranks[0]["train_begin_s"] < 2.0, timeline
    assert fit_lag <= DOWN_GRACE_S + 1.5, timeline
    assert max(exit_lags) <= 2.0, timeline
    with Proxy(mlflow_server.url, port=port):  # the server is back: the user runs the command the warning gave
        result = sync(tmp_path / "down")
    assert result.returncode == 0, result.stderr
    [run] = client.search_runs([client.get_experiment_by_name(names["down"]).experiment_id])
    counts = check_run(client, run.info.run_id, ranks, 6)
    assert run.info.status == "FINISHED"
    report("server_down_whole_training", healthy_s=round(healthy.seconds, 1), down_s=round(down.seconds, 1),
           extra_s=round(extra, 1), **timeline, **counts)  # fmt: skip
    assert extra <= 15.0, (healthy.seconds, down.seconds)


@pytest.fixture(scope="module")
def refused_job(tmp_path_factory, mlflow_server):
    """The 6-epoch training against an address that refuses connections (the job's run precreated): the baseline
    both fronts are held to, run once for both."""
    from mlflow import MlflowClient

    out = tmp_path_factory.mktemp("refused")
    run_id = precreated_run(MlflowClient(mlflow_server.url))
    refused = launch.run(out, ["--epochs", "6"], timeout=400,
                         env={"HVD_MLFLOW_LOG_MODELS": "1", "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}",
                              "MLFLOW_RUN_ID": run_id})  # fmt: skip
    finished_ranks(refused)
    return refused


@pytest.mark.parametrize("front", ["closes", "503"])
def test_a_front_whose_server_is_dead_costs_the_training_what_a_refusing_address_costs(tmp_path, mlflow_server, client,
                                                                                       refused_job, front):  # fmt: skip
    """A load balancer whose backend is dead, for the whole training: it accepts every connection and closes it
    without an answer ("closes"), or answers 503 to everything ("503"). Default settings (flush_timeout 60 s, MLflow's
    own retries, model logging on), the job's run in MLFLOW_RUN_ID. The same 6-epoch training against an address that
    refuses connections, side by side: the front must be known down as fast (before: 82 s against 31 s, the end of
    fit waiting on MLflow's retries and the model's upload); then the journal keeps everything and sync delivers it."""
    defaults = {"HVD_MLFLOW_LOG_MODELS": "1"}
    runs = {front: precreated_run(client)}
    refused = refused_job
    dead = (lambda request: RESET) if front == "closes" else (lambda request: Respond(503))
    with Proxy(mlflow_server.url, fault=dead) as proxy:
        down = launch.run(tmp_path / "front", ["--epochs", "6"], timeout=400,
                          env={**defaults, "MLFLOW_TRACKING_URI": proxy.url, "MLFLOW_RUN_ID": runs[front]})  # fmt: skip
        ranks = finished_ranks(down)
        answered = [r.status for r in proxy.requests]
    fit_lag = ranks[0]["fit_returned_at"] - ranks[1]["fit_returned_at"]
    timeline = {
        "refused_s": round(refused.seconds, 1),
        "front_s": round(down.seconds, 1),
        "fit_lag_s": round(fit_lag, 2),
        "end_fit_s": ranks[0].get("end_fit_s"),
        "requests": len(answered),
    }
    assert answered and set(answered) <= ({0} if front == "closes" else {503}), answered  # the front never forwarded
    assert "hvd-mlflow sync" in down.output and "the model was not logged" in down.output, down.output[-3000:]
    assert fit_lag <= DOWN_GRACE_S + 1.5, timeline  # as fast as a refusing address (test above)
    assert down.seconds <= refused.seconds + 10.0, timeline
    [journal] = journals(tmp_path / "front")
    result = sync(tmp_path / "front", str(journal), "--tracking-uri", mlflow_server.url)  # the backend is back
    assert result.returncode == 0, result.stdout + result.stderr
    counts = check_run(client, runs[front], ranks, 6)
    report(f"front_with_dead_server_{front}", **timeline, **counts)


def test_a_server_gone_for_good_mid_run_ends_the_fit_in_seconds_model_included(tmp_path, mlflow_server, client):
    """Default settings with model logging: the run is open and answered, then the server goes away for good at the
    first metrics request, seconds before the end of fit (12 epochs of 0.5 s: the sender's MLflow import and the run's
    creation come first). The end of fit, model upload included, is over DOWN_GRACE_S after the address is known to
    refuse, not flush_timeout later; `sync` with the server back delivers every epoch once."""
    name = f"gone-{uuid.uuid4().hex[:8]}"
    proxy: Proxy
    # stops listening (from a thread of its own: the proxy's handler cannot wait for its own shutdown), for good
    fault, seen = at_metrics_request(1, lambda: threading.Thread(target=proxy.stop).start())
    with Proxy(mlflow_server.url, fault=fault) as proxy:  # stopped by the fault, again (a no-op) on the way out
        port = proxy.port
        done = launch.run(tmp_path, ["--epochs", "12", "--epoch-sleep", "0.5"], timeout=400,
                          env={"HVD_MLFLOW_LOG_MODELS": "1", "MLFLOW_TRACKING_URI": proxy.url,
                               "MLFLOW_EXPERIMENT_NAME": name})  # fmt: skip
    ranks = finished_ranks(done)
    fit_lag = ranks[0]["fit_returned_at"] - ranks[1]["fit_returned_at"]
    said = "the model was not logged: the tracking server does not answer"  # known down, not a timed-out upload
    assert seen["metric_requests"] >= 1 and said in done.output, done.output[-3000:]
    timeline = {k: ranks[0].get(k) for k in ("train_end_s", "end_fit_began_s", "end_fit_s")}  # rank 0's end of fit
    # hvd-mlflow's own end: DOWN_GRACE_S once the address refuses. The whole fit's lag behind rank 1 more loosely: a
    # fresh CI run saw 4.80 s with hvd-mlflow's part at 3.004 s (1.9 s elsewhere on a loaded machine, not yet
    # attributed: the timeline says where, next time); the faults this guards against cost 10-58 s
    assert timeline["end_fit_s"] <= DOWN_GRACE_S + 0.5 and fit_lag <= DOWN_GRACE_S + 3.0, (fit_lag, timeline)
    with Proxy(mlflow_server.url, port=port):  # the server is back: the user runs the command the warning gave
        result = sync(tmp_path)
    assert result.returncode == 0, result.stderr
    [run] = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    counts = check_run(client, run.info.run_id, ranks, 12)
    assert run.info.status == "FINISHED"
    report("server_gone_mid_run_with_model", fit_lag_s=round(fit_lag, 2), **timeline, **counts)


def test_sync_from_another_host_skips_a_journal_a_training_still_writes(tmp_path, mlflow_server, client):
    """``hvd-mlflow sync`` run, while the training runs, under another host name (as from another machine that
    shares the journal directory): it must leave the live journal alone, and not end the run it creates."""
    name = f"sync-live-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "work"
    result: list = []
    with Proxy(mlflow_server.url, fault=lambda r: Delay(0.5)) as proxy:
        training = threading.Thread(
            target=lambda: result.append(
                train(out, proxy.url, args=["--epochs", "8", "--epoch-sleep", "1.0"], MLFLOW_EXPERIMENT_NAME=name)
            )
        )
        training.start()
        deadline = time.monotonic() + 120
        while not journals(out) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert journals(out), "the training never made a journal"
        time.sleep(2.0)  # a few epochs in: the run exists and has points
        elsewhere = subprocess.run(
            ["unshare", "--uts", "sh", "-c", f"hostname other-host && {sys.executable} -m hvd_mlflow.tools.cli sync"],
            cwd=out, env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_server.url}, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        training.join(300)
    ranks = finished_ranks(result[0])
    said = elsewhere.stdout + elsewhere.stderr
    assert "skipped, a training still sends from it" in said and "entries uploaded" not in said, said
    [run] = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    counts = check_run(client, run.info.run_id, ranks, 8)
    assert run.info.status == "FINISHED"  # ended by the training with its outcome, not KILLED by the sync
    report("sync_during_training", sync_output=elsewhere.stdout.strip(), **counts)
