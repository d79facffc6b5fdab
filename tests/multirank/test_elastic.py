"""Horovod elastic: rank 0's process is killed mid-training, a survivor becomes rank 0, the run goes on.

Two processes (discovery script: ``localhost:1`` and ``127.0.0.1:1``), tf_keras / Keras 2 (Horovod's elastic
Keras state does not work with Keras 3). The first rank 0 SIGKILLs itself right after the end of global epoch
2, whose values are then in its journal but most likely not yet sent (the sender waits 0.5 s between requests).
Every epoch the survivors completed must be in the run exactly once, at the elastic state's epoch, with the
global value of the ranks that ran it: both ranks' mean before the kill, the survivor's own value after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from tests.support import launch
from tests.support.checks import report

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

EPOCHS, KILL_AT = 8, 2
WORKER = launch.WORKER.parent / "elastic_worker.py"


def test_rank0_killed_run_continues_with_every_epoch_once(tmp_path, mlflow_server, client, keras_mode):
    import keras

    if keras_mode == "keras" and int(keras.__version__.split(".")[0]) >= 3:
        pytest.skip("Horovod's elastic Keras state does not work with Keras 3 (use TF_USE_LEGACY_KERAS=1)")
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\n")
    discover.chmod(0o755)
    command = [
        str(launch.BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
        "--host-discovery-script", str(discover), "--network-interface", "lo", "--gloo",
        sys.executable, str(WORKER), "--out", str(tmp_path), "--epochs", str(EPOCHS), "--kill-at", str(KILL_AT),
    ]  # fmt: skip
    experiment = f"elastic-{uuid.uuid4().hex[:8]}"  # its own experiment: the only run there is this training's
    env = launch._env(
        {
            "MLFLOW_TRACKING_URI": mlflow_server.url,
            "MLFLOW_EXPERIMENT_NAME": experiment,
            "HOROVOD_ELASTIC_TIMEOUT": "60",
        }
    )
    start = time.time()
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=480)
    output = done.stdout + done.stderr
    (tmp_path / "output.log").write_text(output)
    assert done.returncode == 0, output[-6000:]

    lines = [json.loads(line) for f in sorted(tmp_path.glob("epochs-*.jsonl")) for line in f.read_text().splitlines()]
    by_epoch: dict[int, list[dict]] = {}
    for line in sorted(lines, key=lambda line: line["time"]):
        by_epoch.setdefault(line["epoch"], []).append(line)
    assert sorted(by_epoch) == list(range(EPOCHS)), sorted(by_epoch)  # the survivors finished the training
    assert all(by_epoch[e][0]["size"] == 2 for e in range(KILL_AT + 1))  # before the kill: 2 ranks
    assert all(len(by_epoch[e]) == 1 and by_epoch[e][0]["size"] == 1 for e in range(KILL_AT + 1, EPOCHS))
    # Horovod commits before its UpdateEpochStateCallback moves the epoch on, so the survivor redoes the
    # killed epoch after the reset: that step is in the run once, with its first (2-rank) value.
    first = {e: group[: group[0]["size"]] for e, group in by_epoch.items()}
    redone = [e for e, group in by_epoch.items() if len(group) > group[0]["size"]]
    assert len(list(tmp_path.glob("done-*.json"))) == 1  # one process finished; the killed one did not

    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id], max_results=50)
    assert len(runs) == 1  # one run, continued by the new rank 0
    [run] = runs
    for key in ("loss", "val_loss", "accuracy"):
        points = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        assert [p.step for p in points] == list(range(EPOCHS)), key  # every epoch once, at the state's epoch
        for point in points:
            ran = first[point.step]
            want = np.mean([r["local"][key] for r in ran])  # equal shards: the exact value is the mean
            assert point.value == pytest.approx(want, rel=1e-6, abs=1e-7), (key, point.step)
    report("elastic", epochs=EPOCHS, killed_after_epoch=KILL_AT, redone_after_reset=redone, steps_in_run=EPOCHS,
           seconds=round(time.time() - start, 1))  # fmt: skip
    assert client.get_run(run.info.run_id).info.status == "FINISHED"  # the new rank 0 ended the run it inherited
    assert "different values for param" not in output  # params are not logged again after a reset
