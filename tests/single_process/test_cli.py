"""The hvd-mlflow command against the real session server."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from mlflow.entities import Metric

from hvd_mlflow.plotting import curves
from tests.support.environment import clean_environment

pytestmark = pytest.mark.once  # the command line and the uploader: no Keras in them

CLI = str(Path(sys.executable).parent / "hvd-mlflow")


def test_plot_draws_each_metric_with_its_validation_twin(tmp_path, mlflow_server, client):
    run_id = client.create_run(client.create_experiment(f"plot-{uuid.uuid4().hex[:8]}")).info.run_id
    points = [Metric(k, v * (s + 1), 1000 + s, s) for s in range(3) for k, v in (("loss", 1.0), ("val_loss", 2.0))]
    client.log_batch(run_id, metrics=[*points, Metric("accuracy", 0.5, 1000, 0)])
    assert curves(client, run_id) == {
        "accuracy": {"accuracy": [(0, 0.5)]},
        "loss": {"loss": [(0, 1.0), (1, 2.0), (2, 3.0)], "val_loss": [(0, 2.0), (1, 4.0), (2, 6.0)]},
    }
    out = tmp_path / "curves.png"
    done = subprocess.run([CLI, "plot", run_id, "-o", str(out), "--tracking-uri", mlflow_server.url],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "2 chart(s), 3 curve(s)" in done.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    # "last": the most recently started run of MLFLOW_EXPERIMENT_NAME (an older run there has other metrics)
    experiment = client.get_run(run_id).info.experiment_id
    name = client.get_experiment(experiment).name
    client.log_batch(client.create_run(experiment, start_time=1).info.run_id, metrics=[Metric("older", 1.0, 1, 0)])
    env = {**os.environ, "MLFLOW_EXPERIMENT_NAME": name}
    done = subprocess.run([CLI, "plot", "last", "-o", str(out), "--tracking-uri", mlflow_server.url],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "2 chart(s), 3 curve(s)" in done.stdout and run_id in done.stdout


def test_sync_with_no_journal_says_so(tmp_path):
    done = subprocess.run([CLI, "sync"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "nothing to upload" in done.stdout


def test_every_command_has_help():
    for command in ([], ["sync"], ["import-csv"], ["plot"], ["doctor"]):
        done = subprocess.run([CLI, *command, "--help"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "Usage:" in done.stdout, command


def doctor(cwd, **env):

    clean = clean_environment()
    return subprocess.run([CLI, "doctor"], cwd=cwd, env={**clean, "TF_CPP_MIN_LOG_LEVEL": "3", **env},
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_doctor_healthy_then_unreachable_then_pending_journal(tmp_path, mlflow_server):
    from hvd_mlflow.journal import FileJournal, JournalMeta

    healthy = doctor(tmp_path, MLFLOW_TRACKING_URI=mlflow_server.url)
    assert healthy.returncode == 0, healthy.stdout
    assert "/health answered 200" in healthy.stdout and "horovod" in healthy.stdout
    down = doctor(tmp_path, MLFLOW_TRACKING_URI="http://alice:pw-123456@127.0.0.1:1")
    assert down.returncode == 1 and "does not answer" in down.stdout and "start the server" in down.stdout
    assert "pw-123456" not in down.stdout  # credentials masked
    FileJournal.create(tmp_path / ".hvd_mlflow" / "journal", JournalMeta.new()).append("metrics", {"loss": 1.0}, 0, 1)
    pending = doctor(tmp_path, MLFLOW_TRACKING_URI=mlflow_server.url)
    assert (
        pending.returncode == 1 and "1 in .hvd_mlflow/journal" in pending.stdout and "hvd-mlflow sync" in pending.stdout
    )


def test_bad_input_is_one_line_never_a_traceback(tmp_path, mlflow_server):
    """Each command, given what a user gets wrong: a one-line error naming it (and what to do), exit code 1."""
    no_epoch = tmp_path / "no_epoch.csv"
    no_epoch.write_text("step,loss\n0,1\n")
    good = tmp_path / "training_metrics.csv"
    good.write_text("epoch,loss\n0,1.0\n1,0.5\n")
    not_a_journal = tmp_path / "x.journal.sqlite"
    not_a_journal.write_text("this is not SQLite")
    unknown = "0" * 32
    cases = {
        "plot of an unknown run": (["plot", unknown, "-o", str(tmp_path / "x.png")], f"id={unknown} not found"),
        "import-csv without an epoch column": (["import-csv", str(no_epoch), "--experiment", "x"], "no 'epoch' column"),
        "import-csv into an unknown run": (["import-csv", str(good), "--run-id", unknown], "not found"),
        "sync of a file that is not a journal": (["sync", str(not_a_journal)], "not fully uploaded"),
    }
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server.url}
    for case, (args, said) in cases.items():
        done = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
        assert done.returncode == 1, case
        assert "Traceback" not in done.stderr + done.stdout, case
        assert len(errors) == 1 and said in errors[0], (case, done.stderr)
    assert "not an hvd-mlflow journal" in done.stderr  # the last case says why, on its own line


def test_the_troubleshooting_logging_recipe_works(tmp_path):
    """docs/troubleshooting.md: DEBUG on the hvd_mlflow logger stays DEBUG when a callback is created (it used to
    be reset by every callback's __init__)."""
    script = (
        "import logging, hvd_mlflow\n"
        "logging.basicConfig()\n"
        "logging.getLogger('hvd_mlflow').setLevel(logging.DEBUG)\n"
        "hvd_mlflow.HorovodMlflowCallback(flavour='keras')\n"
        "print(logging.getLogger('hvd_mlflow').getEffectiveLevel())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "10"
