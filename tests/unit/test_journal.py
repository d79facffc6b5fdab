"""The journal: durable entries, the typed meta record, the memory fallback, the writer lock."""

from __future__ import annotations

import logging
import math
import sqlite3
import subprocess
import sys
import threading

import pytest

from hvd_mlflow.delivery.journal import (
    DELIVERED,
    REJECTED,
    FileJournal,
    JournalMeta,
    LiveJournal,
    MemoryJournal,
    find,
    writer_state,
)


def meta(**fields) -> JournalMeta:
    return JournalMeta.new(tracking_uri="http://x", **fields)


def test_entries_survive_reopen_in_order_and_acknowledgements_stick(tmp_path):
    journal = FileJournal.create(tmp_path, meta())
    seqs = [journal.append("metrics", {"loss": 1.0 / (s + 1)}, step=s, timestamp_ms=100 + s) for s in range(5)]
    journal.acknowledge(seqs[:2])
    journal.close()
    again = FileJournal.open(find(tmp_path)[0])
    assert [e.step for e in again.pending()] == [2, 3, 4]
    assert again.count(DELIVERED) == 2
    assert again.meta().tracking_uri == "http://x" and len(again.meta().journal_id) == 32
    again.acknowledge([seqs[2]], state=REJECTED)
    assert again.count() == 2 and again.count(REJECTED) == 1


def test_meta_is_typed_and_round_trips_through_the_file(tmp_path):
    original = meta(run_id="r1", job_mode=True, created_run=True, run_tags={"a": "b"}, experiment_id="7")
    journal = FileJournal.create(tmp_path, original)
    # the rows, as an independent reader of the file sees them: booleans "1"/"0", tags as JSON
    rows = dict(sqlite3.connect(journal.path).execute("SELECT key, value FROM meta"))
    assert rows["job_mode"] == "1" and rows["created_run"] == "1" and rows["ended"] == "0"
    assert rows["run_tags"] == '{"a": "b"}' and rows["run_id"] == "r1" and rows["final_status"] is None
    assert journal.meta() == original
    updated = journal.update_meta(final_status="FINISHED", ended=True)
    assert FileJournal.open(journal.path).meta() == updated
    assert updated.final_status == "FINISHED" and updated.ended and updated.run_tags == {"a": "b"}
    with pytest.raises(TypeError):
        journal.update_meta(no_such_field=1)


def test_journal_file_is_owner_only(tmp_path):
    journal = FileJournal.create(tmp_path / "j", meta())
    assert journal.path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "j").stat().st_mode & 0o777 == 0o700


def test_nan_and_inf_round_trip(tmp_path):
    journal = FileJournal.create(tmp_path, meta())
    journal.append("metrics", {"a": float("nan"), "b": float("inf"), "c": -float("inf")}, step=0, timestamp_ms=1)
    payload = journal.pending()[0].payload
    assert math.isnan(payload["a"]) and payload["b"] == math.inf and payload["c"] == -math.inf


def test_memory_journal_is_bounded_and_counts_what_it_dropped():
    journal = MemoryJournal(meta(), max_points=10)
    journal.append("params", {"p": "1"})
    for step in range(6):
        journal.append("metrics", {"a": 1.0, "b": 2.0, "c": 3.0}, step=step, timestamp_ms=step)
    # 18 values for a bound of 10: the three oldest epochs went (9 values); params are never dropped
    assert journal.dropped_points == 9
    assert [e.step for e in journal.pending() if e.kind == "metrics"] == [3, 4, 5]
    assert journal.pending()[0].payload == {"p": "1"}


def test_memory_journal_is_safe_between_threads():
    journal = MemoryJournal(meta())

    def write(offset: int) -> None:
        for step in range(500):
            journal.append("metrics", {"x": 1.0}, step=offset + step, timestamp_ms=step)

    threads = [threading.Thread(target=write, args=(k * 1000,)) for k in range(4)]
    for thread in threads:
        thread.start()
    seen = 0
    while any(t.is_alive() for t in threads) or journal.count():
        batch = journal.pending(50)
        journal.acknowledge([e.seq for e in batch])
        seen += len(batch)
    for thread in threads:
        thread.join()
    assert seen == 2000 and journal.count(DELIVERED) == 2000


def test_live_journal_moves_to_memory_when_the_file_fails_and_keeps_what_was_pending(tmp_path, caplog):
    live = LiveJournal(FileJournal.create(tmp_path, meta(run_id="r")))
    first = live.append("metrics", {"loss": 1.0}, step=0, timestamp_ms=1)
    second = live.append("metrics", {"loss": 0.5}, step=1, timestamp_ms=2)
    live.acknowledge([first])
    live.file._db.execute("PRAGMA query_only = ON")  # every write now fails as on a full or read-only disk
    third = live.append("metrics", {"loss": 0.25}, step=2, timestamp_ms=3)
    assert live.in_memory and "cannot be written" in caplog.text
    assert [(e.seq, e.step) for e in live.pending()] == [(second, 1), (third, 2)]  # the pending one, same seq
    assert third > second and live.meta().run_id == "r"
    live.acknowledge([second, third])  # acknowledgements go to memory too: nothing is sent twice
    assert live.count() == 0
    live.update_meta(ended=True)
    assert live.meta().ended


def test_live_journal_in_memory_from_the_start_when_no_file_can_be_created(tmp_path, caplog):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    live = LiveJournal.open_new(blocked / "journal", meta())
    assert live.in_memory and live.location == "memory" and "keeping it in memory" in caplog.text
    live.append("params", {"p": "1"})
    assert live.count() == 1


def test_sqlite_that_cannot_work_on_the_filesystem_falls_back_too(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise sqlite3.OperationalError("disk I/O error")  # not an OSError: what a network mount gives

    monkeypatch.setattr(sqlite3, "connect", broken)
    live = LiveJournal.open_new(tmp_path, meta())
    assert live.in_memory and find(tmp_path) == []  # no half-made file left behind


HOLD = """
import sys, time
from pathlib import Path
from hvd_mlflow.delivery.journal import FileJournal, JournalMeta
journal = FileJournal.create(Path(sys.argv[1]), JournalMeta.new())
print(journal.path, flush=True)
time.sleep(60)
"""


def test_the_writer_lock_tells_a_live_writer_in_another_process_and_goes_with_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        path = holder.stdout.readline().strip()
        assert writer_state(path) == "alive"
        other = FileJournal.open(path)
        assert other.take_over() is False  # sync from anywhere: skipped while the writer lives
        other.close()
    finally:
        holder.kill()
        holder.wait()
    assert writer_state(path) == "gone"  # the kernel released it with the process
    again = FileJournal.open(path)
    assert again.take_over() is True
    assert writer_state(path) == "alive"  # held by this sync now: a second sync skips it
    again.close()


def test_a_journal_without_lock_file_is_judged_by_pid_on_this_host(tmp_path):
    journal = FileJournal.create(tmp_path, meta())
    journal.close()
    (tmp_path / (journal.path.name + ".lock")).unlink()
    assert writer_state(journal.path) == "unknown"
    dead = FileJournal.open(journal.path)
    dead.update_meta(pid=2**22 + 12345)  # no such process
    assert dead.take_over() is True


def test_acknowledging_many_entries_or_writing_the_meta_is_one_transaction(tmp_path):
    """The connection commits each statement on its own (autocommit): a batch of acknowledgements, or the meta's
    rows, must be one transaction (one fsync), not one per row, which held the journal from the training thread's
    appends for a few ms per request."""
    journal = FileJournal.create(tmp_path, meta())
    seqs = [journal.append("metrics", {"loss": 1.0}, step=s, timestamp_ms=s) for s in range(20)]
    statements: list[str] = []
    journal._db.set_trace_callback(statements.append)
    journal.acknowledge(seqs)
    journal.update_meta(run_id="r-1")
    journal._db.set_trace_callback(None)
    updates = [s for s in statements if s.startswith("UPDATE entries")]
    meta_rows = [s for s in statements if s.startswith("INSERT OR REPLACE INTO meta")]
    assert len(updates) == 20 and len(meta_rows) == len(meta().to_rows())
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == ["BEGIN IMMEDIATE", "COMMIT"] * 2
    assert journal.count(DELIVERED) == 20 and journal.meta().run_id == "r-1"


def test_a_failed_acknowledgement_leaves_nothing_half_done(tmp_path):
    journal = FileJournal.create(tmp_path, meta())
    seqs = [journal.append("metrics", {"loss": 1.0}, step=s, timestamp_ms=s) for s in range(3)]
    with pytest.raises(sqlite3.Error):
        journal.acknowledge([seqs[0], object()])  # the second row cannot be bound
    assert journal.count() == 3 and not journal._db.in_transaction
    journal.acknowledge(seqs)
    assert journal.count() == 0


class _Failing:
    """A journal connection that fails inside a transaction: at COMMIT with the transaction still open (a busy
    database), or in a statement after SQLite rolled the transaction back itself (a full disk)."""

    def __init__(self, db: sqlite3.Connection, where: str) -> None:
        self._db, self._where = db, where

    def execute(self, sql, *args):
        if sql == "COMMIT" and self._where == "commit":
            raise sqlite3.OperationalError("database is locked")
        return self._db.execute(sql, *args)

    def executemany(self, sql, rows):
        if self._where == "statement":
            self._db.execute("ROLLBACK")  # what SQLite does on SQLITE_FULL
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.executemany(sql, rows)

    def __getattr__(self, name):
        return getattr(self._db, name)


@pytest.mark.parametrize(("where", "error"), [("commit", "locked"), ("statement", "disk is full")])
def test_a_failed_transaction_raises_its_own_error_and_leaves_none_open(tmp_path, where, error):
    journal = FileJournal.create(tmp_path, meta())
    seqs = [journal.append("metrics", {"loss": 1.0}, step=s, timestamp_ms=s) for s in range(3)]
    real, journal._db = journal._db, _Failing(journal._db, where)
    with pytest.raises(sqlite3.OperationalError, match=error):  # not "cannot rollback - no transaction is active"
        journal.acknowledge(seqs)
    journal._db = real
    assert not real.in_transaction and journal.count() == 3
    journal.append("metrics", {"loss": 0.5}, step=3, timestamp_ms=3)  # its own transaction, not a stale one
    journal.acknowledge([])  # nothing to do: no transaction
    assert journal.count() == 4 and not real.in_transaction


def test_a_journal_that_moved_to_memory_writes_back_what_memory_did_when_released(tmp_path):
    """The file fails (query_only: as a full disk), the memory journal delivers some entries, journals one more and
    records the outcome; at release the file says so (a new connection: the disk works again). It kept the stale
    pending entries and no outcome, so a later sync resent what memory delivered, lost the entry journaled in
    memory, and ended the FINISHED run as KILLED."""
    file = FileJournal.create(tmp_path, meta(run_id="r", created_run=True))
    live = LiveJournal(file)
    params = live.append("params", {"epochs": "3"})
    first = live.append("metrics", {"loss": 1.0}, step=0, timestamp_ms=1)
    second = live.append("metrics", {"loss": 0.5}, step=1, timestamp_ms=2)
    live.acknowledge([params])
    file._db.execute("PRAGMA query_only = ON")  # every write on the training's connection fails from now on
    third = live.append("metrics", {"loss": 0.25}, step=2, timestamp_ms=3)
    assert live.in_memory
    live.acknowledge([first])  # delivered by the memory journal
    live.acknowledge([second], state=REJECTED, reason="metrics loss at step 1: refused")
    live.update_meta(final_status="FINISHED")
    live.release(delete=False)  # the sender could not deliver ``third`` before the end of fit
    kept = FileJournal.open(file.path)
    assert [(e.seq, e.step, e.payload) for e in kept.pending()] == [(third, 2, {"loss": 0.25})]
    assert kept.count(DELIVERED) == 2 and [(e.seq, why) for e, why in kept.rejected()] == [
        (second, "metrics loss at step 1: refused")]  # fmt: skip
    assert kept.meta().final_status == "FINISHED" and kept.meta().moved_to_memory
    assert kept.meta().run_id == "r" and kept.meta().created_run
    kept.close()


def test_a_journal_that_moves_to_memory_marks_its_file_at_once_when_it_can(tmp_path):
    """The training's connection fails (query_only); a new one can still write: the file says moved_to_memory at
    once, so a sync after a crash (no write-back) knows memory may have delivered some of its entries. It said
    nothing until the end of the fit."""
    file = FileJournal.create(tmp_path, meta(run_id="r"))
    live = LiveJournal(file)
    live.append("metrics", {"loss": 1.0}, step=0, timestamp_ms=1)
    file._db.execute("PRAGMA query_only = ON")
    live.append("metrics", {"loss": 0.5}, step=1, timestamp_ms=2)
    assert live.in_memory
    seen = FileJournal.open(file.path)
    assert seen.meta().moved_to_memory and seen.meta().run_id == "r" and seen.count() == 1
    seen.close()
    live.release(delete=False)


def test_appending_many_entries_is_one_transaction_all_or_none(tmp_path):
    """An elastic replay journals its epochs and batches at once: one transaction (one fsync), and a payload
    that cannot be written leaves none of them (the file is not left with half a replay)."""
    journal = FileJournal.create(tmp_path, meta())
    statements: list[str] = []
    journal._db.set_trace_callback(statements.append)
    last = journal.append_many([("metrics", {"loss": 1.0 / (s + 1)}, s, 100 + s) for s in range(5)])
    journal._db.set_trace_callback(None)
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == ["BEGIN IMMEDIATE", "COMMIT"]
    assert [(e.seq, e.step, e.timestamp_ms, e.payload) for e in journal.pending()][-1] == (last, 4, 104, {"loss": 0.2})
    assert journal.count() == 5
    with pytest.raises(TypeError):
        journal.append_many([("metrics", {"loss": 2.0}, 5, 105), ("metrics", {"loss": object()}, 6, 106)])
    assert journal.count() == 5 and not journal._db.in_transaction
    assert journal.append_many([]) == 0


def test_live_journal_appends_many_to_memory_after_a_fall_back(tmp_path):
    live = LiveJournal(FileJournal.create(tmp_path, meta(run_id="r")))
    live.append("metrics", {"loss": 1.0}, step=0, timestamp_ms=1)
    live.file._db.execute("PRAGMA query_only = ON")  # the file fails inside the transaction: memory takes all
    last = live.append_many([("metrics", {"loss": 0.5}, 1, 2), ("metrics", {"loss": 0.25}, 2, 3)])
    assert live.in_memory
    assert [(e.step, e.payload["loss"]) for e in live.pending()] == [(0, 1.0), (1, 0.5), (2, 0.25)]
    assert last == live.pending()[-1].seq


def test_two_trainings_that_create_the_same_new_experiment_at_once_both_open_their_runs(tmp_path):
    """Two jobs starting together into a new experiment name (a sweep): both look it up, find none, and create it;
    the second creation is refused (RESOURCE_ALREADY_EXISTS) and must find the first one's, not give up on the run."""
    from mlflow.entities import Experiment
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS

    from hvd_mlflow.delivery.run_lifecycle import RunLifecycle

    class Raced:
        made: list[str] = []

        def get_experiment_by_name(self, name):
            return Experiment("42", name, "", "active") if self.made else None

        def create_experiment(self, name):
            self.made.append(name)  # the other job's, an instant earlier
            raise MlflowException(f"Experiment '{name}' already exists.", error_code=RESOURCE_ALREADY_EXISTS)

    journal = LiveJournal(FileJournal.create(tmp_path, JournalMeta.new(tracking_uri="http://x", experiment_name="new")))
    lifecycle = RunLifecycle(journal, Raced())
    assert lifecycle._experiment_id() == "42" and journal.meta().experiment_id == "42"


def test_a_released_journal_still_says_how_many_entries_it_left(tmp_path):
    """The sender thread releases the journal when it ends during close(); close() then counts what is left to say
    where it is kept (seen: 'this journal was released' raised out of close, at the end of a fit)."""
    live = LiveJournal(FileJournal.create(tmp_path, JournalMeta.new(tracking_uri="http://x")))
    live.append_many([("metrics", {"loss": 1.0}, 0, 1), ("metrics", {"loss": 0.5}, 1, 2)])
    live.acknowledge([live.pending()[0].seq])
    live.release()
    assert live.count() == 1
    reopened = FileJournal.open(next(tmp_path.glob("*.journal.sqlite")))
    assert reopened.count() == 1


# docs/reliability.md: "The memory journal holds at most 200,000 unsent values"
DOCUMENTED_MEMORY_BOUND = 200_000


def _overfill_and_close_undelivered(live: LiveJournal, epochs: int) -> None:
    """``epochs`` epochs of 100 values each into ``live``, then a real sender to a real MLflow store that refuses
    the run (its experiment does not exist), closed: the end of fit's warning says what was not delivered."""
    import time

    from hvd_mlflow.delivery.limits import MLFLOW
    from hvd_mlflow.delivery.sender import Sender

    for step in range(epochs):
        live.append("metrics", {f"m{k}": float(step) for k in range(100)}, step=step, timestamp_ms=step)
    sender = Sender(live, live.meta().tracking_uri, MLFLOW)
    sender.start()
    sender.begin()
    assert sender.close("FINISHED", deadline=time.monotonic() + 1.0) is False


@pytest.mark.parametrize(
    "how",
    [
        "in memory from the start",
        "moved from its file",
    ],
)
def test_a_memory_journal_counts_the_values_it_dropped_in_its_warnings_which_name_the_journal_dir(
    tmp_path, caplog, how
):
    """reliability.md: past 200,000 unsent values the memory journal drops the oldest unsent epochs and counts them
    in the warning, which names HVD_MLFLOW_JOURNAL_DIR (what it holds is lost when the process ends); a journal is in
    memory when no file can be created, or after its file failed (disk full, ...)."""
    import re

    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # the store made first: MLflow 2.12 creates it with alembic's fileConfig, which replaces the root logger's
    # handlers, pytest's capture among them (put back: added once at most)
    MlflowClient(uri).search_experiments()
    logging.getLogger().addHandler(caplog.handler)
    epochs = DOCUMENTED_MEMORY_BOUND // 100 + 3
    with caplog.at_level("WARNING", logger="hvd_mlflow"):
        meta = JournalMeta.new(tracking_uri=uri, experiment_id="404404", resume="log")  # a run MLflow refuses
        if how == "in memory from the start":
            blocked = tmp_path / "file-not-dir"  # no journal file can be created there
            blocked.write_text("")
            live = LiveJournal.open_new(blocked / "journal", meta)
        else:
            live = LiveJournal(FileJournal.create(tmp_path, meta))
            live.append("params", {"p": "1"})
            live.file._db.execute("PRAGMA query_only = ON")  # every write now fails as on a full disk
        _overfill_and_close_undelivered(live, epochs)
        assert live.in_memory
    dropped = epochs * 100 - DOCUMENTED_MEMORY_BOUND  # the three oldest epochs
    assert live.dropped_points == dropped
    said = [r.getMessage() for r in caplog.records if r.name == "hvd_mlflow" and r.levelname == "WARNING"]
    counted = [int(m.group(1)) for text in said for m in [re.search(r"as are (\d+) older values", text)] if m]
    assert counted == [dropped], said
    assert [text for text in said if "HVD_MLFLOW_JOURNAL_DIR" in text], said
    assert MlflowClient(uri).search_runs(["0"]) == []  # nothing reached the store: it was all in memory


def test_entries_memory_let_go_that_the_file_still_holds_keep_the_file_and_are_left_for_sync(tmp_path):
    """The file fails with more unsent values than memory holds: memory takes them over and lets the oldest go, which
    the file still holds. Once memory delivered the rest, releasing with delete=True (everything memory had was
    delivered) keeps the file and writes back into it: the entries memory let go stay pending there, for sync. It
    deleted the file, and with it the only copy of those entries, silently."""
    meta = JournalMeta.new(tracking_uri="http://127.0.0.1:9")
    live = LiveJournal(FileJournal.create(tmp_path, meta))
    epochs = DOCUMENTED_MEMORY_BOUND // 100 + 3
    live.append_many([("metrics", {f"m{k}": 1.0 for k in range(100)}, step, step) for step in range(epochs)])
    path = live.file.path
    live.file._db.execute("PRAGMA query_only = ON")  # every write now fails as on a full disk
    live.append("tags", {"t": "1"})  # the failed write moves the journal to memory, which takes the file's entries
    assert live.in_memory and live.left_in_file == 3 and live.dropped_points == 0
    live.acknowledge([entry.seq for entry in live.pending(limit=10**9)])
    assert live.count() == 0
    live.release(delete=True)
    assert path.exists()
    kept = FileJournal.open(path)
    assert [entry.step for entry in kept.pending(limit=10)] == [0, 1, 2]  # the three oldest epochs, for sync
    assert kept.count(DELIVERED) == epochs - 3 and kept.meta().moved_to_memory  # the rest, settled as in memory
    kept.close()
