"""Two real Horovod ranks, a real MLflow server: one point per metric per epoch, equal to the global value.

The truth is computed here from what Keras itself reported on each rank (see tests/workers/fit_worker.py),
never from hvd-mlflow's code.
"""

from __future__ import annotations

import socket
import uuid

import pytest

from tests.support import launch
from tests.support.checks import expected_global, report
from tests.support.proxy import Proxy

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

EPOCHS = 4
DYNAMICS = {"learning_rate", "epoch_time_s", "samples_per_s"}  # rank 0's per-epoch extras


def assert_run_holds_global_values(client, run_id: str, ranks: list[dict]) -> int:
    """Every metric: exactly EPOCHS points, steps 0..EPOCHS-1, each the mean of the ranks' local values."""
    expected = expected_global(ranks, EPOCHS)
    assert set(expected) >= {"loss", "accuracy", "val_loss", "val_accuracy"}
    run = client.get_run(run_id)
    assert set(run.data.metrics) == set(expected) | DYNAMICS
    checked = 0
    for key, values in expected.items():
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == list(range(EPOCHS)), key
        for point, want in zip(history, values, strict=True):
            assert point.value == pytest.approx(want, rel=1e-6, abs=1e-7), (key, point.step)
            checked += 1
    # The ranks really disagreed, so an average was needed (otherwise this test proves nothing).
    assert any(ranks[0]["local"][e]["loss"] != ranks[1]["local"][e]["loss"] for e in range(EPOCHS))
    # Every later callback on every rank saw the global values (History is the last callback).
    for r in ranks:
        for key, values in expected.items():
            assert r["history"][key] == pytest.approx(values, rel=1e-6), (key, r["history"][key], values)
    return checked


def assert_each_point_sent_once(proxy: Proxy, keys) -> None:
    """What reached the server: every (metric, epoch) exactly once, in at most one request per epoch.

    A second writer (rank 1 logging too) would double the points. Fewer requests than epochs is fine: when
    rank 0's sender falls behind (fast epochs), it packs several epochs into one request.
    """
    requests = proxy.metric_requests()
    sent = sorted((m["key"], int(m["step"])) for r in requests for m in r.metrics)
    assert sent == sorted((k, e) for k in [*keys, *DYNAMICS] for e in range(EPOCHS))
    assert 1 <= len(requests) <= EPOCHS


# README and reference.md: the 5 tags of hvd-mlflow's own in every run (journal_id only on runs it created)
EVERY_RUN_TAGS = {f"hvd_mlflow.{name}" for name in ("engine", "world_size", "reduction", "keras_flavour", "hosts")}


def assert_params(client, run_id: str, batch_size_known: bool = True, steps: int = 6, created: bool = False) -> None:
    params = client.get_run(run_id).data.params
    assert params["epochs"] == str(EPOCHS)
    assert params["world_size"] == "2"
    if batch_size_known:  # autolog sees fit's arguments; a callback alone cannot know the batch size
        assert params["batch_size"] == "16"
        assert params["global_batch_size"] == "32"
    else:
        assert "batch_size" not in params
    assert params["steps_per_epoch"] == str(steps)  # 96 samples / 16 by default
    assert params["initial_epoch"] == "0"
    assert params["optimizer_name"] == "SGD"
    assert float(params["learning_rate"]) == pytest.approx(0.05)
    for name in (
        "tensorflow_version",
        "keras_version",
        "horovod_version",
        "mlflow_version",
        "hvd_mlflow_version",
    ):
        assert params[name], name
    tags = client.get_run(run_id).data.tags
    assert tags["hvd_mlflow.world_size"] == "2"
    assert tags["hvd_mlflow.hosts"] == f"{socket.gethostname()}:0-1"  # both ranks on this host
    assert tags["hvd_mlflow.reduction"] == "exact"
    assert tags["hvd_mlflow.engine"] == "horovod"
    assert tags["hvd_mlflow.keras_flavour"] in ("keras", "tf_keras")
    own = {key for key in tags if key.startswith("hvd_mlflow.")}
    assert own == EVERY_RUN_TAGS | ({"hvd_mlflow.journal_id"} if created else set()), own


def precreated_run_job(out_dir, mlflow_server, client, how: str) -> tuple[str, launch.Launch, Proxy]:
    """As in an AzureML job: every rank inherits MLFLOW_RUN_ID, through a proxy that records the requests; under
    autolog also ``csv_path`` (rank 0's local CSV sends nothing: the requests are the same)."""
    experiment = client.create_experiment(f"precreated-{uuid.uuid4().hex[:8]}")
    run_id = client.create_run(experiment).info.run_id
    args = ["--epochs", str(EPOCHS)] + (["--explicit-callback"] if how == "explicit-callback" else [])
    csv = {"HVD_MLFLOW_CSV_PATH": "metrics.csv"} if how == "autolog" else {}
    with Proxy(mlflow_server.url) as proxy:  # autolog's job: the installed horovodrun, the README's own command
        done = launch.run(out_dir, args, env={"MLFLOW_TRACKING_URI": proxy.url, "MLFLOW_RUN_ID": run_id, **csv},
                          installed_horovodrun=how == "autolog")  # fmt: skip
    return run_id, done, proxy


@pytest.fixture(scope="module")
def autolog_precreated(mlflow_server, tmp_path_factory):
    """One autolog job into a pre-created run, shared by the tests that read it (each its own checks)."""
    from mlflow import MlflowClient

    return precreated_run_job(tmp_path_factory.mktemp("precreated"), mlflow_server, MlflowClient(mlflow_server.url),
                              "autolog")  # fmt: skip


@pytest.mark.parametrize("how", ["autolog", "explicit-callback"])
def test_azureml_style_precreated_run(tmp_path, mlflow_server, client, how, request):
    """As in an AzureML job: every rank inherits MLFLOW_RUN_ID; only rank 0 writes, only global values."""
    if how == "autolog":
        run_id, done, proxy = request.getfixturevalue("autolog_precreated")
    else:
        run_id, done, proxy = precreated_run_job(tmp_path, mlflow_server, client, how)
    done.check()
    ranks = [done.rank(0), done.rank(1)]
    assert_run_holds_global_values(client, run_id, ranks)
    assert_params(client, run_id, batch_size_known=how == "autolog")
    assert [r["run_id"] for r in ranks] == [run_id, run_id]
    assert [r["run_id_at_train_begin"] for r in ranks] == [run_id, run_id]  # a known run: on every rank at once
    assert_each_point_sent_once(proxy, ranks[0]["local"][0])
    # a run hvd-mlflow did not create is not ended by it
    assert client.get_run(run_id).info.status == "RUNNING"
    assert not [r for r in proxy.requests if r.path.endswith(("/runs/create", "/runs/update"))]


@pytest.mark.once  # the sender creates the run: no Keras in it
def test_no_run_id_rank0_creates_exactly_one_run(tmp_path, mlflow_server, client):
    """Nothing waits for the run at train begin: rank 0's sender opens it while the first epochs train (1,250
    batches each here, a few seconds: longer than MLflow's import and one request), and its id reaches rank 1 in an
    epoch's collective."""
    name = f"fresh-{uuid.uuid4().hex[:8]}"
    with Proxy(mlflow_server.url) as proxy:
        done = launch.run(
            tmp_path,
            ["--epochs", str(EPOCHS), "--samples", "20000"],
            env={"MLFLOW_TRACKING_URI": proxy.url, "MLFLOW_EXPERIMENT_NAME": name},
        )
    done.check()
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    ranks = [done.rank(0), done.rank(1)]
    assert [r["run_id"] for r in ranks] == [run.info.run_id] * 2
    assert_run_holds_global_values(client, run.info.run_id, ranks)
    assert_params(client, run.info.run_id, steps=1250, created=True)
    assert len([r for r in proxy.requests if r.path.endswith("/runs/create")]) == 1
    assert_each_point_sent_once(proxy, ranks[0]["local"][0])


SET_UP_AND_END = 6  # the most requests a run may cost besides its metric requests (docs/reliability.md)
AROUND_A_RUN = {"experiments/get-by-name", "experiments/create", "runs/create", "runs/log-batch", "runs/update"}


@pytest.mark.once  # the sender's requests: no Keras in them
def test_a_run_costs_at_most_one_request_per_epoch_and_the_same_few_around_it(tmp_path, mlflow_server, client):
    """At most one metric request per epoch, plus set-up and end requests whose number does not grow with epochs.

    Whether params and tags share a request with each other or with the first metrics depends on when the sender
    wakes: so the requests around the run are bounded and of known kinds, not an exact list."""
    around = {}
    for epochs in (2, 12):
        name = f"requests-{epochs}-{uuid.uuid4().hex[:8]}"
        with Proxy(mlflow_server.url) as proxy:
            env = {"MLFLOW_TRACKING_URI": proxy.url, "MLFLOW_EXPERIMENT_NAME": name}
            launch.run(tmp_path / f"epochs{epochs}", ["--epochs", str(epochs)], env=env).check()
        (run,) = client.search_runs([client.get_experiment_by_name(name).experiment_id])
        assert len(client.get_metric_history(run.info.run_id, "loss")) == epochs  # every epoch arrived
        with_metrics = [r for r in proxy.requests if r.metrics]
        assert 1 <= len(with_metrics) <= epochs
        # the end of fit's question whether the server can answer (delivery/reachability.py: while no answer came, or
        # a call has waited 1 s; a loaded machine sees it): a GET of the server's URL or of experiment 0, a few at most
        probes = [r for r in proxy.requests if r.path.split("?")[0] in ("/", "/api/2.0/mlflow/experiments/get")]
        assert len(probes) <= 3, probes
        around[epochs] = [r.path.split("?")[0].split("/mlflow/", 1)[1] for r in proxy.requests
                          if not r.metrics and r not in probes]  # fmt: skip
        assert set(around[epochs]) <= AROUND_A_RUN, around[epochs]
        assert len(around[epochs]) <= SET_UP_AND_END, around[epochs]
    assert {"runs/create", "runs/update"} <= set(around[12])  # created and ended, once each
    assert sum(p == "runs/create" for p in around[12]) == sum(p == "runs/update" for p in around[12]) == 1
    report("requests_per_run", set_up_and_end=around)


@pytest.mark.once  # the layout check of the fused collective: no Keras in it
def test_ranks_with_different_metric_keys_fail_fast_with_a_clear_error(tmp_path, mlflow_server):
    done = launch.run(
        tmp_path, ["--epochs", "2", "--mismatch"], env={"MLFLOW_TRACKING_URI": mlflow_server.url}, timeout=120
    )
    assert done.returncode != 0
    assert done.seconds < 60, f"took {done.seconds:.0f} s"
    assert "MetricKeyMismatchError" in done.output
    # both ranks raise, and the message names what rank 0 lacks
    assert done.output.count("rank 0 lacks: mae") >= 2, done.output[-4000:]


def test_one_process_without_horovodrun(tmp_path, mlflow_server, client):
    experiment = client.create_experiment(f"solo-{uuid.uuid4().hex[:8]}")
    run_id = client.create_run(experiment).info.run_id
    done = launch.run(
        tmp_path,
        ["--epochs", str(EPOCHS)],
        env={"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_RUN_ID": run_id},
        horovodrun=False,
    ).check()
    local = done.rank(0)["local"]
    for key in local[0]:
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [(m.step, m.value) for m in history] == [(e, pytest.approx(local[e][key])) for e in range(EPOCHS)]
    assert client.get_run(run_id).data.params["world_size"] == "1"


def test_csv_sidecar_in_keras_format_and_import_csv(mlflow_server, client, autolog_precreated):
    """autolog(csv_path=...) writes the global values on rank 0 only, in CSVLogger's format; import-csv brings
    that file into a run, at step = epoch, and a second import adds nothing."""
    import csv
    import subprocess
    import sys
    from pathlib import Path

    _, done, _ = autolog_precreated
    done.check()
    ranks = [done.rank(0), done.rank(1)]
    expected = expected_global(ranks, EPOCHS)
    rows = list(csv.DictReader((done.out_dir / "metrics.csv").open()))
    assert list(rows[0]) == ["epoch", *sorted(expected)]  # CSVLogger: epoch, then the keys sorted
    for epoch, row in enumerate(rows):
        assert int(row["epoch"]) == epoch
        for key, values in expected.items():
            assert float(row[key]) == pytest.approx(values[epoch], rel=1e-6)
    name = f"imported-{uuid.uuid4().hex[:8]}"
    command = [str(Path(sys.executable).parent / "hvd-mlflow"), "import-csv", str(done.out_dir / "metrics.csv"),
               "--experiment", name, "--tracking-uri", mlflow_server.url]  # fmt: skip
    first = subprocess.run(command, capture_output=True, text=True, timeout=120)
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert f"{EPOCHS * len(expected)} points sent" in first.stdout
    assert "0 points sent" in again.stdout
    [run] = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    for key, values in expected.items():
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == list(range(EPOCHS))
        assert [m.value for m in history] == pytest.approx(values, rel=1e-6)


def tf_keras_2(done) -> bool:
    """Whether the worker ran Keras 2 (TF 2.15's own keras package)."""
    return done.rank(0).get("keras_major") == 2


def test_learning_rate_follows_the_schedule_and_throughput_is_measured(tmp_path, mlflow_server, client):
    run_id = client.create_run(client.create_experiment(f"dyn-{uuid.uuid4().hex[:8]}")).info.run_id
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_RUN_ID": run_id}
    samples = 960  # 60 steps: epochs long enough (~0.3 s) that a few ms of callback time is not 20% of them
    done = launch.run(tmp_path, ["--epochs", str(EPOCHS), "--lr-schedule", "--samples", str(samples)], env=env).check()
    history = {k: sorted(client.get_metric_history(run_id, k), key=lambda m: m.step) for k in DYNAMICS}
    steps_per_epoch = samples // 16
    # Keras 3 reports the rate of the next step, tf_keras / Keras 2 the rate its last step used
    offset = 0 if done.rank(0)["flavour"] == "keras" and not tf_keras_2(done) else 1
    want_lr = [0.1 * 0.9 ** (steps_per_epoch * (e + 1) - offset) for e in range(EPOCHS)]
    assert [m.value for m in history["learning_rate"]] == pytest.approx(want_lr, rel=1e-5)
    # global samples per second: both ranks' samples over the epoch's wall time. The worker's spy times the epoch
    # from before the first callback's epoch begin to after the last one's epoch end: an interval that encloses
    # hvd-mlflow's, so the rate it gives is a lower bound (a fixed tolerance flaked when another callback was slow)
    measured = done.rank(0)["epoch_seconds"]
    for m in history["samples_per_s"]:
        at_least = 2 * samples / measured[m.step]
        assert at_least * (1 - 1e-6) <= m.value <= 3 * at_least, (m.step, m.value, measured[m.step])
    assert [m.step for m in history["epoch_time_s"]] == list(range(EPOCHS))
