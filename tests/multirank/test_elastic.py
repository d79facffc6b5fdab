"""Horovod elastic: rank 0's process is killed mid-training, a survivor becomes rank 0, the run goes on.

Two processes (discovery script: ``localhost:1`` and ``127.0.0.1:1``), tf_keras / Keras 2 (Horovod's elastic
Keras state does not work with Keras 3). The first rank 0 SIGKILLs itself right after the end of global epoch
2, whose values are then in its journal but most likely not yet sent (the sender waits 0.5 s between requests).
Every epoch the survivors completed must be in the run exactly once, at the elastic state's epoch, with the
global value of the ranks that ran it: both ranks' mean before the kill, the survivor's own value after; with
hvd-mlflow's per-epoch extras and every logged batch once, before any ``sync`` of the killed rank 0's journal.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from tests.support import horovodrun, launch
from tests.support.checks import journals, report, sync
from tests.support.proxy import Proxy

pytestmark = [pytest.mark.multirank, pytest.mark.oldest, pytest.mark.timeout(600)]

EPOCHS, KILL_AT = 8, 2
EVERY, BATCHES_PER_EPOCH = 2, 6  # batch values logged every 2 steps; 96 samples per rank in batches of 16
DYNAMICS = ("learning_rate", "epoch_time_s", "samples_per_s")  # hvd-mlflow's per-epoch extras
WORKER = launch.WORKER.parent / "elastic_worker.py"


def elastic_training(
    tmp_path,
    tracking_uri: str,
    keras_mode,
    *extra: str,
    np: int = 2,
    discover_script: str = "",
    experiment: str | None = None,
    env: dict[str, str] | None = None,
) -> tuple[str, str, float]:
    """Run the elastic worker (``np`` processes, min 1, max 2); return its output, the experiment name, the seconds."""
    import keras

    if keras_mode == "keras" and int(keras.__version__.split(".")[0]) >= 3:
        pytest.skip("Horovod's elastic Keras state does not work with Keras 3 (use TF_USE_LEGACY_KERAS=1)")
    discover = tmp_path / "discover.sh"
    discover.write_text(discover_script or "#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\n")
    discover.chmod(0o755)
    command = [
        *horovodrun.command(), "-np", str(np), "--min-np", "1", "--max-np", "2",
        "--host-discovery-script", str(discover), "--network-interface", "lo", "--gloo",
        sys.executable, str(WORKER), "--out", str(tmp_path), "--epochs", str(EPOCHS), "--kill-at", str(KILL_AT),
        *extra,
    ]  # fmt: skip
    experiment = experiment or f"elastic-{uuid.uuid4().hex[:8]}"  # its own: the only run there is this training's
    env = launch._env(
        {
            "MLFLOW_TRACKING_URI": tracking_uri,
            "MLFLOW_EXPERIMENT_NAME": experiment,
            "HOROVOD_ELASTIC_TIMEOUT": "60",
            **horovodrun.env(),
            **(env or {}),
        }
    )
    start = time.time()
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=480)
    output = done.stdout + done.stderr
    (tmp_path / "output.log").write_text(output)
    assert done.returncode == 0, output[-6000:]
    return output, experiment, time.time() - start


def epochs_by_global_epoch(tmp_path) -> dict[int, list[dict]]:
    lines = [json.loads(line) for f in sorted(tmp_path.glob("epochs-*.jsonl")) for line in f.read_text().splitlines()]
    by_epoch: dict[int, list[dict]] = {}
    for line in sorted(lines, key=lambda line: line["time"]):
        by_epoch.setdefault(line["epoch"], []).append(line)
    return by_epoch


def assert_every_epoch_once(client, experiment: str, by_epoch: dict[int, list[dict]]) -> str:
    """The experiment's one run holds every epoch once, with the global value of the ranks that first ran it,
    and is FINISHED; returns its id."""
    first = {e: group[: group[0]["size"]] for e, group in by_epoch.items()}
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id], max_results=50)
    assert len(runs) == 1  # one run, continued by whoever is rank 0
    [run] = runs
    for key in ("loss", "val_loss", "accuracy"):
        points = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        assert [p.step for p in points] == list(range(EPOCHS)), key  # every epoch once, at the state's epoch
        for point in points:
            want = np.mean([r["local"][key] for r in first[point.step]])  # equal shards: the exact value is the mean
            assert point.value == pytest.approx(want, rel=1e-6, abs=1e-7), (key, point.step)
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    return run.info.run_id


def test_rank0_killed_run_continues_with_every_epoch_once(tmp_path, mlflow_server, client, keras_mode):
    output, experiment, seconds = elastic_training(tmp_path, mlflow_server.url, keras_mode, "--every", str(EVERY))
    by_epoch = epochs_by_global_epoch(tmp_path)
    assert sorted(by_epoch) == list(range(EPOCHS)), sorted(by_epoch)  # the survivors finished the training
    assert all(by_epoch[e][0]["size"] == 2 for e in range(KILL_AT + 1))  # before the kill: 2 ranks
    assert all(len(by_epoch[e]) == 1 and by_epoch[e][0]["size"] == 1 for e in range(KILL_AT + 1, EPOCHS))
    # Horovod commits before its UpdateEpochStateCallback moves the epoch on, so the survivor redoes the
    # killed epoch after the reset: that step is in the run once, with its first (2-rank) value.
    redone = [e for e, group in by_epoch.items() if len(group) > group[0]["size"]]
    assert len(list(tmp_path.glob("done-*.json"))) == 1  # one process finished; the killed one did not

    run_id = assert_every_epoch_once(client, experiment, by_epoch)  # the new rank 0 ended the run it inherited
    # what the killed rank 0 had not sent, the survivor replayed: the epochs' extras and the batch points too
    for key in DYNAMICS:
        assert sorted(p.step for p in client.get_metric_history(run_id, key)) == list(range(EPOCHS)), key
    batches = BATCHES_PER_EPOCH * (EPOCHS + len(redone))  # optimizer steps: the redone epoch's go on counting
    batch_steps = sorted(p.step for p in client.get_metric_history(run_id, "batch/loss"))
    assert batch_steps == list(range(EVERY, batches + 1, EVERY)), batch_steps  # each logged batch once
    # the killed rank 0 left its journal (no outcome, no hand-over): sync delivers it and never ends the shared run
    # (it was ended KILLED here, on top of the survivor's FINISHED)
    assert journals(tmp_path)
    synced = sync(tmp_path)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert_every_epoch_once(client, experiment, by_epoch)
    assert "the run is left as it is" in synced.stdout
    report("elastic", epochs=EPOCHS, killed_after_epoch=KILL_AT, redone_after_reset=redone, steps_in_run=EPOCHS,
           seconds=round(seconds, 1))  # fmt: skip
    assert "different values for param" not in output  # params are not logged again after a reset


def test_rank0_killed_in_epoch_0_of_the_job_s_run_its_params_and_hosts_tag_still_reach_the_run(
    tmp_path, mlflow_server, client, keras_mode
):
    """The job's run is known (MLFLOW_RUN_ID, as in an AzureML job) and rank 0 is killed at the end of epoch 0: it had
    journaled the params and the hosts tag at epoch 0's begin, but its sender held them until that epoch's end and
    had not sent them. Whoever is rank 0 after the reset logs them again from what every process kept (the same
    values: the 2-rank world they describe), before any ``sync`` of the killed rank 0's journal."""
    experiment = f"elastic-known-{uuid.uuid4().hex[:8]}"
    run_id = client.create_run(client.create_experiment(experiment)).info.run_id
    output, _, _ = elastic_training(tmp_path, mlflow_server.url, keras_mode, "--kill-at", "0",
                                    experiment=experiment, env={"MLFLOW_RUN_ID": run_id})  # fmt: skip
    by_epoch = epochs_by_global_epoch(tmp_path)
    assert sorted(by_epoch) == list(range(EPOCHS)) and by_epoch[0][0]["size"] == 2  # killed after a 2-rank epoch 0
    run = client.get_run(run_id)
    params = run.data.params
    assert (params.get("world_size"), params.get("epochs"), params.get("initial_epoch")) == ("2", str(EPOCHS), "0")
    assert params.get("optimizer_name") and params.get("tensorflow_version"), params
    assert run.data.tags.get("hvd_mlflow.hosts") == f"{socket.gethostname()}:0-1", run.data.tags  # both ranks' host
    assert "different values for param" not in output
    points = sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)
    assert [p.step for p in points] == list(range(EPOCHS))  # and every epoch once, as when a run is created


def test_rank0_survives_a_reset_its_old_sender_ends_and_nothing_is_doubled(tmp_path, mlflow_server, client, keras_mode):
    """Rank 1 dies; rank 0 survives the reset (a TensorFlow UnknownError inside fit, which Horovod's elastic run
    turns into a reset) and stays rank 0. Its sender of the cut fit must end (no thread left running), the run is
    never ended FAILED, the restarted fit logs on into the same run, and the run ends FINISHED once.

    (A reset by a host added through the discovery script is not tested: on one machine Horovod 0.28.1 hangs in
    it without hvd-mlflow too. tests/unit/test_sender.py covers its path: a sender closed without a status ends.)"""
    idle = 4.0  # /proc's 10 ms ticks: 0.0025 cores per tick over 4 s, the bound is 0.01
    with Proxy(mlflow_server.url) as proxy:
        output, experiment, seconds = elastic_training(
            tmp_path, proxy.url, keras_mode, "--kill-start-rank", "1", "--idle-probe", str(idle)
        )
        updates = [r.json() for r in proxy.requests if r.path.split("?")[0].endswith("/runs/update")]
    by_epoch = epochs_by_global_epoch(tmp_path)
    assert sorted(by_epoch) == list(range(EPOCHS))
    [done_file] = list(tmp_path.glob("done-*.json"))
    survivor = done_file.stem.split("-", 1)[1]
    lines = (tmp_path / f"epochs-{survivor}.jsonl").read_text().splitlines()
    assert all(json.loads(line)["rank"] == 0 for line in lines)  # the surviving process was rank 0 throughout
    assert sorted({line["size"] for group in by_epoch.values() for line in group}) == [1, 2]  # a reset happened
    assert_every_epoch_once(client, experiment, by_epoch)
    assert [u.get("status") for u in updates] == ["FINISHED"], updates  # never FAILED, ended once
    cpu = json.loads(done_file.read_text())["idle_cpu"]
    report("elastic_rank0_survives", idle_cpu_after_reset=round(cpu["after_reset"]["total"], 4),
           idle_cpu_after_fit=round(cpu["after_fit"]["total"], 4), idle_seconds=idle, seconds=round(seconds, 1),
           threads_after_fit={k: round(v, 4) for k, v in cpu["after_fit"]["threads"].items() if v})  # fmt: skip
    for window in ("after_reset", "after_fit"):
        print(window, cpu[window])
        # the cut fit's sender ended (the new fit's own is idle): no hvd-mlflow thread works while nothing happens
        assert sum(v for k, v in cpu[window]["threads"].items() if k.startswith("hvd-mlflow")) < 0.01, cpu[window]
        assert cpu[window]["total"] < 0.1, cpu[window]  # the whole process idles (Horovod's own loop included)
    assert "hvd-mlflow-sender" not in cpu["after_fit"]["threads"]  # after the fit no sender is left at all
    assert "not delivered" not in output  # a reset is not a failure: no flush was waited for, nothing left behind
