"""A restarted job attaching to its run, and a second fit with initial_epoch: every epoch logged once.

Launch A trains epochs 0..3 into a pre-created run (as an AzureML job's run, or ``MLFLOW_RUN_ID``). Launch B
is the same job restarted from an older checkpoint: it trains epochs 2..5 into the same run with a changed
param, then a second ``fit`` continues to epoch 7. Epochs 2 and 3 are already in the run: with the default
``resume="skip"`` they are not logged again (the run keeps A's values), and the changed param becomes a tag.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import launch
from tests.support.checks import report

# a restarted job: every Horovod row (issue #48: the recipes users run, where they run them)
pytestmark = [pytest.mark.multirank, pytest.mark.shared, pytest.mark.oldest, pytest.mark.timeout(900)]


def test_restarted_job_and_second_fit_log_each_epoch_once(tmp_path, mlflow_server, client, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)  # MLflow 2.12 finds artifacts by the global URI
    run_id = client.create_run("0").info.run_id
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_RUN_ID": run_id}
    first = launch.run(tmp_path / "a", ["--epochs", "4", "--attempt", "1"], env=env).check()
    second = launch.run(
        tmp_path / "b",
        ["--initial-epoch", "2", "--epochs", "6", "--then-fit-to", "8", "--attempt", "2"],
        env=env,
    ).check()
    a, b = first.rank(0), second.rank(0)
    assert a["run_id"] == b["run_id"] == run_id

    for key in ("loss", "val_loss", "accuracy"):
        points = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [p.step for p in points] == list(range(8)), key  # each epoch exactly once
        want = a["history"][key] + b["history"][key][2:] + b["history_second_fit"][key]
        # epochs 0-3: launch A's values (B's epochs 2-3 were skipped); 4-5: B's first fit; 6-7: its second fit
        assert [p.value for p in points] == pytest.approx(want, rel=1e-6), key
        assert b["history"][key][:2] != a["history"][key][2:4]  # B's repeated epochs really differed
    data = client.get_run(run_id).data
    assert data.params["attempt"] == "1"  # a param cannot change: the first value stays...
    changes = [json.loads(Path(client.download_artifacts(run_id, f.path, str(tmp_path))).read_text())
               for f in client.list_artifacts(run_id, "hvd_mlflow") if "param-changes" in f.path]  # fmt: skip
    # ...and the new ones are kept in one artifact per fit (never one tag each: AzureML keeps 50 tags per run)
    assert sorted(c["attempt"]["now"] for c in changes) == ["2", "2"]
    assert sorted(c["initial_epoch"]["now"] for c in changes) == ["2", "6"]
    assert not [k for k in data.tags if k.startswith("param_changed")]
    assert "already has different values for" in second.output
    assert "attempt: '1' -> '2'" in second.output
    assert "already holds" in second.output  # the skipped epochs were warned about
    assert client.get_run(run_id).info.status == "RUNNING"  # not ours to end
    report("resume", steps=list(range(8)), param_changes=changes)
