"""The hvd-mlflow command against the real session server."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from mlflow.entities import Metric

from hvd_mlflow.tools.cli import curves
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
    from hvd_mlflow.delivery.journal import FileJournal, JournalMeta

    healthy = doctor(tmp_path, MLFLOW_TRACKING_URI=mlflow_server.url)
    assert healthy.returncode == 0, healthy.stdout
    assert "/health answered 200" in healthy.stdout and "horovod" in healthy.stdout
    down = doctor(tmp_path, MLFLOW_TRACKING_URI="http://alice:pw-123456@127.0.0.1:1")
    assert down.returncode == 1 and "does not answer" in down.stdout and "start the server" in down.stdout
    assert "pw-123456" not in down.stdout  # credentials masked
    FileJournal.create(tmp_path / ".hvd_mlflow" / "journal", JournalMeta.new()).append("metrics", {"loss": 1.0}, 0, 1)
    # the doctor only reads: the journal folder (a live training's, say: this process holds the journal open) holds
    # the same files after it, the journal and its -wal byte for byte (-shm is SQLite's shared-memory index, which
    # every reader of a WAL database updates)
    folder = tmp_path / ".hvd_mlflow" / "journal"

    def contents() -> dict:
        return {p.name: b"" if p.name.endswith("-shm") else p.read_bytes() for p in folder.iterdir()}

    before = contents()
    pending = doctor(tmp_path, MLFLOW_TRACKING_URI=mlflow_server.url)
    assert (
        pending.returncode == 1 and "1 in .hvd_mlflow/journal" in pending.stdout and "hvd-mlflow sync" in pending.stdout
    )
    assert contents() == before


def test_bad_input_is_one_line_never_a_traceback(tmp_path, mlflow_server):
    """Each command, given what a user gets wrong: a one-line error naming it (and what to do), exit code 1."""
    no_epoch = tmp_path / "no_epoch.csv"
    no_epoch.write_text("step,loss\n0,1\n")
    good = tmp_path / "training_metrics.csv"
    good.write_text("epoch,loss\n0,1.0\n1,0.5\n")
    one_column = tmp_path / "one_column.csv"
    one_column.write_text("loss\n1.0\n0.5\n")
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("epoch,loss\n0,1.0\n1,0.5,9\n")
    not_a_journal = tmp_path / "x.journal.sqlite"
    not_a_journal.write_text("this is not SQLite")
    unknown = "0" * 32
    cases = {
        "plot of an unknown run": (["plot", unknown, "-o", str(tmp_path / "x.png")], f"id={unknown} not found"),
        "import-csv without an epoch column": (["import-csv", str(no_epoch), "--experiment", "x"], "no 'epoch' column"),
        "import-csv into an unknown run": (["import-csv", str(good), "--run-id", unknown], "not found"),
        # these two said 'Error: Error: Could not determine delimiter'
        "import-csv of a one-column file": (
            ["import-csv", str(one_column), "--experiment", "x"],
            f"{one_column}: row 1: no 'epoch' column",
        ),
        "import-csv of a ragged file": (
            ["import-csv", str(ragged), "--experiment", "x"],
            f"{ragged}: row 3 has 3 fields, the header 2",
        ),
        "sync of a file that is not a journal": (["sync", str(not_a_journal)], "not an hvd-mlflow journal"),
    }
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server.url}
    for case, (args, said) in cases.items():
        done = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
        assert done.returncode == 1, case
        assert "Traceback" not in done.stderr + done.stdout, case
        assert len(errors) == 1 and said in errors[0], (case, done.stderr)
    assert "it is not an SQLite file" in done.stderr and "left untouched" in done.stderr  # the last case says why


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


def _runs_in(client, experiment_id: str) -> list:
    return client.search_runs([experiment_id])


def _sync(cwd: Path, *args: str | Path, url: str) -> subprocess.CompletedProcess:
    env = {**clean_environment(), "MLFLOW_TRACKING_URI": url}
    return subprocess.run([CLI, "sync", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_sync_refuses_what_is_not_a_journal_and_leaves_it_byte_for_byte(tmp_path, mlflow_server, client):
    """A user's SQLite database (under its own name, and named like a journal), a text file: each refused with one
    line, the file unchanged byte for byte and no companion created beside it, no run anywhere (a journal without
    a tracking URI would have gone to MLflow's default store in the working directory, or to MLFLOW_TRACKING_URI).
    It deleted the user's database and created a KILLED run."""
    import sqlite3

    users = tmp_path / "users_data.sqlite"
    with sqlite3.connect(users) as db:
        db.execute("CREATE TABLE people (name TEXT)")
        db.execute("INSERT INTO people VALUES ('ada')")
    db.close()
    named_like_one = tmp_path / "mine.journal.sqlite"
    named_like_one.write_bytes(users.read_bytes())
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n")
    runs_before = len(_runs_in(client, "0"))
    for path in (users, named_like_one, notes):
        before = path.read_bytes()
        done = _sync(tmp_path, path, url=mlflow_server.url)
        assert done.returncode == 1, (path, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and "not an hvd-mlflow journal" in done.stderr, done.stderr
        assert str(path) in done.stderr and "Traceback" not in done.stderr
        assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.journal.sqlite", "notes.txt", "users_data.sqlite"]
    assert len(_runs_in(client, "0")) == runs_before


def test_sync_of_a_glob_over_the_journal_folder_syncs_each_journal_once(tmp_path, mlflow_server, client):
    """``hvd-mlflow sync .hvd_mlflow/journal/*``: the journal, its lock and SQLite's -wal/-shm (a reader holds them
    open). One run, the journal's points, nothing said about the companions. It synced the lock as an empty
    journal: a second, empty run."""
    import sqlite3

    from hvd_mlflow.delivery.journal import FileJournal, JournalMeta

    folder = tmp_path / ".hvd_mlflow" / "journal"
    experiment = client.create_experiment(f"glob-{uuid.uuid4().hex[:8]}")
    journal = FileJournal.create(folder, JournalMeta.new(tracking_uri=mlflow_server.url, experiment_id=experiment,
                                                         final_status="FINISHED"))  # fmt: skip
    for step in range(3):
        journal.append("metrics", {"loss": 1.0 / (step + 1)}, step=step, timestamp_ms=1000 + step)
    journal.close()
    reader = sqlite3.connect(journal.path)  # keeps -wal and -shm in the folder
    reader.execute("SELECT COUNT(*) FROM entries").fetchone()
    try:
        names = sorted(p.name[len(journal.path.name) :] for p in folder.iterdir())
        assert names == ["", "-shm", "-wal", ".lock"]
        done = _sync(tmp_path, *sorted(folder.iterdir()), url=mlflow_server.url)
    finally:
        reader.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("entries uploaded") == 1 and ".lock" not in done.stdout + done.stderr
    runs = _runs_in(client, experiment)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(runs[0].info.run_id, "loss")] == [
        (0, 1.0), (1, 0.5), (2, 1.0 / 3)]  # fmt: skip
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "mlflow.db").exists()


def test_sync_of_a_glob_beside_a_live_writer_skips_it_and_keeps_its_lock(tmp_path, mlflow_server, client):
    """A journal a training still writes (this process holds its lock): ``sync folder/*`` skips it, creates no run,
    and leaves its lock, so other hosts still see the writer; the writer goes on. It synced the lock file as an
    empty journal into a new run and deleted it. (Opening it for writing before looking at its lock, as the first
    fix did, changed the live journal: an older journal got a table, and its WAL could be checkpointed away.)"""
    import contextlib
    import sqlite3

    from hvd_mlflow.delivery.journal import FileJournal, JournalMeta, writer_state

    folder = tmp_path / ".hvd_mlflow" / "journal"
    experiment = client.create_experiment(f"live-{uuid.uuid4().hex[:8]}")
    journal = FileJournal.create(folder, JournalMeta.new(tracking_uri=mlflow_server.url, experiment_id=experiment))
    journal.append("metrics", {"loss": 1.0}, step=0, timestamp_ms=1000)
    with contextlib.closing(sqlite3.connect(journal.path, isolation_level=None)) as older:
        older.execute("DROP TABLE rejections")  # as a journal written by an earlier hvd-mlflow
    runs_before = len(_runs_in(client, "0"))
    # the journal, its WAL and its lock, as they are: not opened for writing (SQLite's -shm index is not data: any
    # reader, the read-only check's too, marks what it reads there)
    kept = [p for p in folder.iterdir() if not p.name.endswith("-shm")]
    files = {path: path.read_bytes() for path in kept}
    done = _sync(tmp_path, *sorted(folder.iterdir()), url=mlflow_server.url)
    assert {path: path.read_bytes() for path in kept} == files
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("skipped, a training still sends from it") == 1, done.stdout
    assert "uploaded" not in done.stdout and ".lock" not in done.stdout + done.stderr
    assert writer_state(journal.path) == "alive"
    journal.append("metrics", {"loss": 0.5}, step=1, timestamp_ms=1001)
    assert journal.count() == 2
    journal.close()
    assert _runs_in(client, experiment) == [] and len(_runs_in(client, "0")) == runs_before


def test_sync_goes_on_past_a_refused_entry_and_says_what_is_left_and_why(tmp_path, mlflow_server, client):
    """The issue's reproduction: the run holds initial_epoch=0; the journal (resume='log') has params
    initial_epoch=5, a tag and a metric. The params entry is refused for good (MLflow cannot change a param): the
    tag and the metric are delivered in the same sync, the refused entry is named with the server's reason, kept
    in the journal, and sync exits 1; a second sync sends nothing and says the same. It printed '0 entries
    uploaded ..., 3 left' twice with rc 0, and the metric was never sent."""
    from hvd_mlflow.delivery.journal import REJECTED, FileJournal, JournalMeta

    run_id = client.create_run(client.create_experiment(f"refused-{uuid.uuid4().hex[:8]}")).info.run_id
    client.log_param(run_id, "initial_epoch", "0")
    journal = FileJournal.create(tmp_path / "j", JournalMeta.new(tracking_uri=mlflow_server.url, run_id=run_id,
                                                                 created_run=True, resume="log"))  # fmt: skip
    journal.append("params", {"initial_epoch": "5"})
    journal.append("tags", {"t": "1"})
    journal.append("metrics", {"loss": 1.0}, step=5, timestamp_ms=1000)
    journal.close()
    for attempt in range(2):
        done = _sync(tmp_path, journal.path, url=mlflow_server.url)
        assert done.returncode == 1, (attempt, done.stdout, done.stderr)
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
        assert "refused" in errors[0] and "initial_epoch" in errors[0] and "Changing param values" in errors[0]
        assert str(journal.path) in errors[0]
    run = client.get_run(run_id)
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(5, 1.0)]
    assert run.data.params == {"initial_epoch": "0"} and run.data.tags["t"] == "1"
    assert run.info.status == "KILLED"  # everything else delivered: the run is ended with the outcome
    kept = FileJournal.open(journal.path)
    assert kept.count() == 0 and kept.count(REJECTED) == 1
    kept.close()


def _pending_journal(folder: Path, url: str, run_id: str, **meta):
    from hvd_mlflow.delivery.journal import FileJournal, JournalMeta

    journal = FileJournal.create(folder, JournalMeta.new(tracking_uri=url, run_id=run_id, created_run=True, **meta))
    journal.append("metrics", {"loss": 0.5}, step=1, timestamp_ms=1001)
    journal.close()
    return journal


def test_sync_of_an_elastic_rank0_that_died_delivers_and_leaves_the_shared_run_running(tmp_path, mlflow_server, client):
    """Rank 0 of an elastic training died abruptly (no outcome, no hand-over): the other ranks go on in the same run.
    sync delivers the journal's epoch and leaves the run RUNNING. It ended the shared run KILLED."""
    run_id = client.create_run(client.create_experiment(f"elastic-{uuid.uuid4().hex[:8]}")).info.run_id
    journal = _pending_journal(tmp_path / "j", mlflow_server.url, run_id, elastic=True)
    done = _sync(tmp_path, journal.path, url=mlflow_server.url)
    assert done.returncode == 0, done.stderr
    assert client.get_run(run_id).info.status == "RUNNING"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(1, 0.5)]
    assert "the run is left as it is" in done.stdout


def test_sync_never_ends_again_a_run_that_is_ended_already(tmp_path, mlflow_server, client):
    """A journal without the outcome whose run is FINISHED already (a training whose journal moved to memory ended
    it, and its file could not be written back): its entries are delivered, the run stays FINISHED. It was
    ended again as KILLED."""
    run_id = client.create_run(client.create_experiment(f"ended-{uuid.uuid4().hex[:8]}")).info.run_id
    client.set_terminated(run_id, "FINISHED")
    journal = _pending_journal(tmp_path / "j", mlflow_server.url, run_id)
    done = _sync(tmp_path, journal.path, url=mlflow_server.url)
    assert done.returncode == 0, done.stderr
    assert client.get_run(run_id).info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(1, 0.5)]
    assert "its run is FINISHED already" in done.stdout


def test_sync_of_a_journal_that_moved_to_memory_without_writing_back_sends_nothing_twice(
    tmp_path, mlflow_server, client
):
    """The training's journal moved to memory (marked so in the file), memory delivered steps 0 and 1, then the
    process died before writing back: the file still holds steps 0-2 pending, with resume='log'. sync sends step 2
    only (what the run holds was delivered), counted at the server through a recording proxy. It sent all three
    (AzureML, which keeps repeated points, would hold steps 0 and 1 twice)."""
    from hvd_mlflow.delivery.journal import FileJournal, JournalMeta
    from tests.support.proxy import Proxy

    run_id = client.create_run(client.create_experiment(f"moved-{uuid.uuid4().hex[:8]}")).info.run_id
    client.log_batch(run_id, metrics=[Metric("loss", 1.0 / (s + 1), 1000 + s, s) for s in range(2)])
    with Proxy(mlflow_server.url) as proxy:
        journal = FileJournal.create(tmp_path / "j", JournalMeta.new(
            tracking_uri=proxy.url, run_id=run_id, created_run=True, resume="log", moved_to_memory=True))  # fmt: skip
        for step in range(3):
            journal.append("metrics", {"loss": 1.0 / (step + 1)}, step=step, timestamp_ms=1000 + step)
        journal.close()
        done = _sync(tmp_path, journal.path, url=mlflow_server.url)
        sent = sorted((m["key"], int(m["step"])) for r in proxy.metric_requests() for m in r.metrics)
    assert done.returncode == 0, done.stderr
    assert sent == [("loss", 2)]
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [0, 1, 2]
    assert client.get_run(run_id).info.status == "KILLED"  # the process died: the run it created is ended so


def test_sync_with_no_argument_reads_the_journal_dir_and_force_and_keep_work(tmp_path, mlflow_server, client):
    """reliability.md's `hvd-mlflow sync` section: with no argument it reads $HVD_MLFLOW_JOURNAL_DIR; a journal whose
    writer lives (this process holds its lock) is skipped, and uploaded with --force; --keep keeps a delivered
    journal's file, which is deleted otherwise."""
    from hvd_mlflow.delivery.journal import FileJournal, JournalMeta

    run_id = client.create_run(client.create_experiment(f"flags-{uuid.uuid4().hex[:8]}")).info.run_id
    folder = tmp_path / "elsewhere"
    live = FileJournal.create(folder, JournalMeta.new(tracking_uri=mlflow_server.url, run_id=run_id))
    live.append("metrics", {"loss": 0.5}, step=1, timestamp_ms=1001)
    env = {**clean_environment(), "MLFLOW_TRACKING_URI": mlflow_server.url, "HVD_MLFLOW_JOURNAL_DIR": str(folder)}

    def sync(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([CLI, "sync", *flags], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    skipped = sync()
    assert skipped.returncode == 0, skipped.stderr
    assert "skipped, a training still sends from it" in skipped.stdout, skipped.stdout
    assert client.get_metric_history(run_id, "loss") == []
    forced = sync("--force", "--keep")
    assert forced.returncode == 0, forced.stderr
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(1, 0.5)]
    live.close()
    assert live.path.exists()  # --keep
    kept = FileJournal.open(live.path)
    assert kept.count() == 0  # delivered, and marked so
    kept.close()
    again = sync()
    assert again.returncode == 0, again.stderr
    assert not live.path.exists() and [p.name for p in folder.iterdir()] == []  # delivered: deleted, companions too
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(1, 0.5)]  # never twice
    elsewhere = subprocess.run([CLI, "sync"], cwd=tmp_path, env={**env, "HVD_MLFLOW_JOURNAL_DIR": str(tmp_path / "x")},
                               capture_output=True, text=True, timeout=120)  # fmt: skip
    assert f"no journal in {tmp_path / 'x'}" in elsewhere.stdout


def test_doctor_under_tf_config_names_the_world_this_task_and_the_chief(tmp_path, mlflow_server):
    """reference.md's `doctor` and azureml.md's tf.distribute section: under TF_CONFIG each task reports the
    tf.distribute world, itself and the chief (AzureML's TF_CONFIG has no chief task: worker 0 is the chief)."""
    import json

    workers = ["127.0.0.1:20001", "127.0.0.1:20002", "127.0.0.1:20003"]
    config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": 2}})
    done = doctor(tmp_path, MLFLOW_TRACKING_URI=mlflow_server.url, TF_CONFIG=config)
    engine = [line for line in done.stdout.splitlines() if line.split()[1:2] == ["engine"]]
    assert len(engine) == 1, done.stdout
    assert "a world of 3 workers; this task is worker 2 (rank 2)" in engine[0], engine
    assert "the chief, which logs, is worker 0 at 127.0.0.1:20001" in engine[0], engine
    chief = json.dumps({"cluster": {"chief": ["127.0.0.1:20000"], "worker": workers}, "task": {"type": "chief"}})
    done = doctor(tmp_path, MLFLOW_TRACKING_URI=mlflow_server.url, TF_CONFIG=chief)
    assert "a world of 4 workers; this task is chief 0 (rank 0)" in done.stdout, done.stdout
    assert "the chief, which logs, is chief at 127.0.0.1:20000" in done.stdout, done.stdout


def test_verbose_says_what_sync_does(tmp_path, mlflow_server, client):
    """troubleshooting.md: ``hvd-mlflow -v ...`` says more: sync names each journal's entries, server (its
    credentials masked) and run under -v, and says nothing of it without."""
    out = {}
    for verbose in (False, True):
        run_id = client.create_run(client.create_experiment(f"verbose-{uuid.uuid4().hex[:8]}")).info.run_id
        journal = _pending_journal(tmp_path / f"v{verbose}", mlflow_server.url, run_id)
        env = {**clean_environment(), "MLFLOW_TRACKING_URI": mlflow_server.url}
        done = subprocess.run([CLI, *(["-v"] if verbose else []), "sync", str(journal.path)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(1, 0.5)]
        out[verbose] = (done.stderr, f"{journal.path}: 1 entries to send to {mlflow_server.url}, run {run_id}")
    assert out[True][1] in out[True][0], out[True]
    assert "entries to send" not in out[False][0], out[False]


def test_what_mlflow_logs_with_a_trace_is_one_line_and_the_trace_only_under_verbose(tmp_path):
    """README/reference: "Bad input gets a clear one-line error ... never a Python traceback", the full trace with
    ``-v``. MLflow logs its store's SQL errors with their trace (``_logger.exception``): a sqlite store whose
    ``experiments`` table lacks MLflow's columns (a user's database of that name, or one a killed process left) makes
    it do so. Without -v the command printed MLflow's whole Python traceback above its own one-line error."""
    import sqlite3

    store = tmp_path / "mlflow.db"
    with sqlite3.connect(store) as db:
        db.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name VARCHAR(256))")
    journal = _pending_journal(tmp_path / "j", f"sqlite:///{store}", "0" * 32)
    said = {}
    for verbose in (False, True):
        env = {**clean_environment(), "MLFLOW_TRACKING_URI": f"sqlite:///{store}"}
        done = subprocess.run([CLI, *(["-v"] if verbose else []), "sync", "--keep", str(journal.path)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1 and "not uploaded" in errors[0] and "no such column" in errors[0], done.stderr
        said[verbose] = done.stderr
    assert "Traceback" not in said[False] and "no such column" in said[False].replace(said[False].splitlines()[-1], "")
    assert "Traceback (most recent call last)" in said[True]  # -v: MLflow's trace, as it logged it
    # MLflow's own line is still there, on one line: its message, the SQL folded in
    mlflow_lines = [line for line in said[False].splitlines() if "SQLAlchemy database error" in line]
    assert len(mlflow_lines) >= 1 and all("no such column" in line for line in mlflow_lines), said[False]
