"""The uploader against the real session server: idempotent runs and points."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from mlflow import MlflowClient

from hvd_mlflow.delivery.journal import FileJournal, JournalMeta
from hvd_mlflow.delivery.limits import AZUREML, MLFLOW
from hvd_mlflow.delivery.uploader import JOURNAL_ID_TAG, Uploader

pytestmark = pytest.mark.once  # the command line and the uploader: no Keras in them


def journal_for(tmp_path, url: str, **meta) -> FileJournal:
    journal = FileJournal.create(tmp_path, JournalMeta.new(tracking_uri=url, **meta))
    journal.append("params", {"epochs": "3"})
    for step in range(3):
        journal.append("metrics", {"loss": 1.0 / (step + 1), "acc": step / 3}, step=step, timestamp_ms=1000 + step)
    return journal


def test_upload_twice_adds_nothing_the_second_time(tmp_path, mlflow_server, client: MlflowClient):
    name = f"uploader-{uuid.uuid4().hex[:8]}"
    journal = journal_for(tmp_path, mlflow_server.url, experiment_name=name, final_status="FINISHED")
    uploader = Uploader(journal, client, MLFLOW)
    assert uploader.upload_some() == 4 and uploader.upload_some() == 0
    assert uploader.finish()
    run_id = uploader.run_id
    # a second upload of the same points (as after a lost acknowledgement: the journal still has them pending),
    # really sent (resume="log": the run is not read first), stores nothing new: each point kept its timestamp,
    # and the server drops an exact duplicate
    journal2 = journal_for(tmp_path / "again", mlflow_server.url, run_id=run_id, resume="log")
    sent = []
    counting = _Counting(client, sent)
    Uploader(journal2, counting, MLFLOW).upload_some()
    assert sorted((m.key, m.step, m.timestamp) for m in sent) == sorted(
        (key, step, 1000 + step) for key in ("loss", "acc") for step in range(3)
    )
    for key in ("loss", "acc"):
        assert [m.step for m in client.get_metric_history(run_id, key)] == [0, 1, 2]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"epochs": "3"}


def test_a_run_created_by_an_attempt_whose_answer_was_lost_is_found_again(tmp_path, mlflow_server, client):
    experiment_id = client.create_experiment(f"lost-create-{uuid.uuid4().hex[:8]}")
    journal = journal_for(tmp_path, mlflow_server.url, experiment_id=experiment_id, create_attempted="1")
    existing = client.create_run(experiment_id, tags={JOURNAL_ID_TAG: journal.meta().journal_id})
    uploader = Uploader(journal, client, MLFLOW)
    uploader.upload_some()
    assert uploader.run_id == existing.info.run_id
    assert len(client.search_runs([experiment_id])) == 1


def _held_csv(client: MlflowClient, run_id: str, where) -> str:
    """The run's over-budget CSV, found where docs/azureml.md says (``hvd_mlflow/metrics-over-budget-<id>.csv``),
    downloaded: its local path."""
    names = [a.path for a in client.list_artifacts(run_id, "hvd_mlflow")]
    held = [n for n in names if re.fullmatch(r"hvd_mlflow/metrics-over-budget-[0-9a-f]+\.csv", n)]
    assert len(held) == 1, names
    return client.download_artifacts(run_id, held[0], str(where))


class _Counting:
    """The real client, recording every metric it sends."""

    def __init__(self, client: MlflowClient, sent: list) -> None:
        self._client, self._sent = client, sent

    def log_batch(self, run_id, metrics=(), **kwargs):
        self._sent.extend(metrics)
        return self._client.log_batch(run_id, metrics=metrics, **kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)


class _Faulty(_Counting):
    """The real client, recording the metrics the server accepted, with scripted refusals: a permanent 400 for any
    request holding a key in ``refused``, and the next ``transient`` answers before the request reaches the server
    (or, with ``applied``, after it) as 503s; a 401 for every request when ``unauthorised``."""

    def __init__(self, client, sent, refused=(), transient=0, applied=False, unauthorised=False):
        super().__init__(client, sent)
        self.refused, self.transient, self.applied, self.unauthorised = set(refused), transient, applied, unauthorised
        self.calls = 0

    def log_batch(self, run_id, metrics=(), **kwargs):
        from mlflow.exceptions import MlflowException, get_error_code

        if not metrics:
            return self._client.log_batch(run_id, metrics=metrics, **kwargs)
        self.calls += 1
        if self.unauthorised:
            raise MlflowException("unauthorised", error_code=get_error_code(401))
        if self.refused & {m.key for m in metrics}:
            raise MlflowException("metric name refused", error_code=get_error_code(400))
        if self.transient:
            self.transient -= 1
            if self.applied:
                super().log_batch(run_id, metrics=metrics, **kwargs)
            raise MlflowException("busy", error_code=get_error_code(503))
        super().log_batch(run_id, metrics=metrics, **kwargs)


def _upload_through_transient_errors(uploader: Uploader) -> None:
    from mlflow.exceptions import MlflowException

    for _ in range(10):
        try:
            uploader.upload_some()
        except MlflowException:
            continue
        if not uploader.journal.pending(1, kinds=("metrics",)):
            return
    raise AssertionError("the journal was not delivered")


def _keyed_journal(tmp_path, url, keys, steps=3, **meta) -> FileJournal:
    experiment = f"uploader-{uuid.uuid4().hex[:8]}"
    journal = FileJournal.create(tmp_path, JournalMeta.new(tracking_uri=url, experiment_name=experiment, **meta))
    for step in range(steps):
        journal.append("metrics", {k: step + i / 10 for i, k in enumerate(keys)}, step=step, timestamp_ms=1000 + step)
    return journal


def test_a_refused_request_split_by_key_resends_after_a_transient_error_only_what_did_not_go_through(
    tmp_path, mlflow_server, client
):
    # ["a", "b", "bad", "c"] is split into {a, b} (accepted) and {bad, c}, whose first attempt fails transiently;
    # the retry must not send a and b again (a server that keeps duplicates, as AzureML does, would store them twice)
    journal = _keyed_journal(tmp_path, mlflow_server.url, ["a", "b", "bad", "c"], final_status="FINISHED")
    sent = []
    faulty = _Faulty(client, sent, refused={"bad"})
    uploader = Uploader(journal, faulty, MLFLOW)
    original = faulty.log_batch

    def transient_on_the_second_half(run_id, metrics=(), **kwargs):
        if {m.key for m in metrics} == {"bad", "c"} and not getattr(faulty, "failed_once", False):
            faulty.failed_once = True
            from mlflow.exceptions import MlflowException, get_error_code

            raise MlflowException("busy", error_code=get_error_code(503))
        return original(run_id, metrics=metrics, **kwargs)

    faulty.log_batch = transient_on_the_second_half
    _upload_through_transient_errors(uploader)
    accepted = sorted((m.key, m.step) for m in sent)
    assert accepted == sorted((k, s) for k in ("a", "b", "c") for s in range(3)), accepted
    assert uploader.finish()
    held = _held_csv(client, uploader.run_id, tmp_path / "dl")
    rows = [line for line in open(held).read().splitlines()[1:] if line]
    assert len(rows) == 3 and all("bad" in r for r in rows), rows


def test_values_over_the_name_budget_are_held_once_whatever_the_retries(tmp_path, mlflow_server, client):
    # a budget of 2 names for 3 keys: "c" is held for the CSV; two transient failures resend the request, and the
    # CSV must still hold each of c's 3 values once
    journal = _keyed_journal(tmp_path, mlflow_server.url, ["a", "b", "c"], max_metric_names=2, final_status="FINISHED")
    sent = []
    uploader = Uploader(journal, _Faulty(client, sent, transient=2), MLFLOW)
    _upload_through_transient_errors(uploader)
    assert len(journal.pending(100, kinds=("over_budget",))) == 3  # not one set per attempt
    assert uploader.finish()
    assert sorted((m.key, m.step) for m in sent) == sorted((k, s) for k in ("a", "b") for s in range(3))
    held = _held_csv(client, uploader.run_id, tmp_path / "dl")
    lines = [line for line in open(held).read().splitlines() if line]
    assert len(lines) == 1 + 3, lines  # the header and c's three values, once each


def test_a_refusal_of_the_request_itself_is_not_split_by_key(tmp_path, mlflow_server, client):
    from mlflow.exceptions import MlflowException

    # a 401 says nothing about the metric names: splitting the request by key would refuse every name one by one
    journal = _keyed_journal(tmp_path, mlflow_server.url, [f"m{i}" for i in range(8)], steps=1)
    faulty = _Faulty(client, [], unauthorised=True)
    uploader = Uploader(journal, faulty, MLFLOW)
    with pytest.raises(MlflowException, match="unauthorised"):  # nor is any entry rejected for it (test below)
        uploader.upload_some()
    assert faulty.calls == 1
    assert uploader.names.refused == {}


def test_batch_values_do_not_wait_for_an_epoch_end_on_a_server_without_a_name_budget(tmp_path, mlflow_server, client):
    # only per-batch values so far (a long first epoch): without a per-run name limit nothing needs settling
    experiment = f"uploader-{uuid.uuid4().hex[:8]}"
    journal = FileJournal.create(tmp_path, JournalMeta.new(tracking_uri=mlflow_server.url, experiment_name=experiment))
    for step in range(5):
        journal.append("metrics", {"batch/loss": 1.0 / (step + 1)}, step=step, timestamp_ms=1000 + step)
    uploader = Uploader(journal, client, MLFLOW)
    assert uploader.upload_some() == 5
    assert [m.step for m in client.get_metric_history(uploader.run_id, "batch/loss")] == [0, 1, 2, 3, 4]


def test_a_training_that_ends_before_its_first_epoch_end_still_delivers_its_batch_values(
    tmp_path, mlflow_server, client
):
    # with a name budget, batch values wait for the first epoch values to settle it; when the training ended
    # (failed) inside its first epoch, none will come, and the budget must settle on what there is
    experiment = f"uploader-{uuid.uuid4().hex[:8]}"
    meta = JournalMeta.new(
        tracking_uri=mlflow_server.url, experiment_name=experiment, max_metric_names=50, final_status="FAILED"
    )
    journal = FileJournal.create(tmp_path, meta)
    for step in range(5):
        journal.append("metrics", {"batch/loss": 1.0 / (step + 1)}, step=step, timestamp_ms=1000 + step)
    uploader = Uploader(journal, client, MLFLOW)
    assert uploader.upload_some() == 5
    assert uploader.finish()
    assert [m.step for m in client.get_metric_history(uploader.run_id, "batch/loss")] == [0, 1, 2, 3, 4]
    assert client.get_run(uploader.run_id).info.status == "FAILED"


class _RefusingStep(_Counting):
    """The real client, but every request holding a value of ``step`` is refused as a whole with a 403 (a refusal
    that says nothing about metric names: never split by key); counts the metric requests."""

    def __init__(self, client, sent, step):
        super().__init__(client, sent)
        self.step, self.requests = step, 0

    def log_batch(self, run_id, metrics=(), **kwargs):
        from mlflow.exceptions import MlflowException, get_error_code

        if metrics:
            self.requests += 1
            if any(m.step == self.step for m in metrics):
                raise MlflowException("forbidden", error_code=get_error_code(403))
        return super().log_batch(run_id, metrics=metrics, **kwargs)


def test_after_the_refused_entry_is_found_entries_are_packed_again(tmp_path, mlflow_server, client):
    """A request refused as a whole makes the uploader send one entry per request until it finds the refused one;
    then it packs again. (It left that mode only when a call found nothing pending, which the sender no longer
    makes while training: every request after one refusal carried one epoch.)"""
    journal = _keyed_journal(tmp_path, mlflow_server.url, ["a"], steps=3)
    refusing = _RefusingStep(client, [], step=1)
    uploader = Uploader(journal, refusing, MLFLOW)
    uploader.upload_some()  # steps 0-2 in one request: refused, one by one from now on
    uploader.upload_some()  # 0, 1 (rejected), 2: three requests
    assert refusing.requests == 4 and not journal.pending(1, kinds=("metrics",))
    for step in range(3, 8):  # later epochs, while the training goes on
        journal.append("metrics", {"a": float(step)}, step=step, timestamp_ms=1000 + step)
    uploader.upload_some()
    assert refusing.requests == 5  # the five in one request
    assert [m.step for m in client.get_metric_history(uploader.run_id, "a")] == [0, 2, 3, 4, 5, 6, 7]


def test_the_tag_budget_counts_the_tags_the_server_adds_to_a_run_it_creates(tmp_path, mlflow_server, client):
    """AzureML's 50 tags include the ones the service sets itself: a run created here holds, besides the tags sent
    with its creation, what the server added (MLflow's server: ``mlflow.runName``), and the budget counts them."""
    own = {f"t_{i:02d}": "x" for i in range(10)}
    journal = FileJournal.create(
        tmp_path,
        JournalMeta.new(tracking_uri=mlflow_server.url, experiment_name=f"tags-{uuid.uuid4().hex[:8]}", run_tags=own),
    )
    later = {f"u_{i:02d}": "y" for i in range(45)}
    journal.append("tags", later)
    uploader = Uploader(journal, client, AZUREML)
    while uploader.upload_some():
        pass
    tags = client.get_run(uploader.run_id).data.tags
    assert "mlflow.runName" in tags  # the premise: the server added a tag of its own at creation
    assert len(tags) == 50  # 10 + the journal's id + the server's + 38 of the later ones: not one more
    kept = {k for k in later if k in tags}
    [artifact] = [f.path for f in client.list_artifacts(uploader.run_id, "hvd_mlflow") if f.path.endswith(".json")]
    held = client.download_artifacts(uploader.run_id, artifact, str(tmp_path / "download"))
    with open(held) as f:
        assert json.load(f) == {k: v for k, v in later.items() if k not in kept}  # the rest, every one, held
    assert len(kept) == 50 - len(own) - 2


def test_what_the_uploader_remembers_of_held_values_ends_with_their_entries(tmp_path, mlflow_server, client):
    """Values over the name budget: the uploader remembers which (entry, key) it held only until the entry is
    acknowledged, so a long run does not grow it by one per held value (it kept all 100 here, for the whole fit);
    the CSV still holds each held value once."""
    journal = _keyed_journal(tmp_path, mlflow_server.url, ["a", "b", "c", "d"], steps=50, max_metric_names=2,
                             final_status="FINISHED")  # fmt: skip
    uploader = Uploader(journal, client, MLFLOW)
    uploader.deliver(until_done=True)
    assert not journal.pending(1, kinds=("metrics",))
    assert len(uploader.names.held) == 0
    assert uploader.finish()
    held = _held_csv(client, uploader.run_id, tmp_path / "dl")
    rows = sorted(tuple(line.split(",")[:2]) for line in open(held).read().splitlines()[1:] if line)
    assert rows == sorted((k, str(s)) for k in ("c", "d") for s in range(50))


class _RecordingReads:
    """A journal that records the largest read of held values."""

    def __init__(self, journal):
        self._journal, self.largest_held_read = journal, 0

    def pending(self, limit=1000, kinds=None, **kwargs):
        if kinds == ("over_budget",):
            self.largest_held_read = max(self.largest_held_read, limit)
        return self._journal.pending(limit, kinds=kinds, **kwargs)

    def __getattr__(self, name):
        return getattr(self._journal, name)


def test_the_over_budget_csv_is_built_a_page_at_a_time(tmp_path, mlflow_server, client, monkeypatch):
    """The held values are read from the journal a page at a time (it read them all in one list, with every row in a
    set and a sorted copy); the CSV still holds each held value once, sorted by name and step, NaN included."""
    from hvd_mlflow.delivery import metric_names as delivery

    monkeypatch.setattr(delivery, "HELD_PAGE", 7)
    journal = _keyed_journal(tmp_path, mlflow_server.url, ["a", "b", "c"], steps=30, max_metric_names=2,
                             final_status="FINISHED")  # fmt: skip
    journal.append("over_budget", {"c": 0.2}, step=0, timestamp_ms=1000)  # a repeat, as a retry may hold it
    journal.append("over_budget", {"c": float("nan")}, step=30, timestamp_ms=1030)
    recording = _RecordingReads(journal)
    uploader = Uploader(recording, client, MLFLOW)
    uploader.deliver(until_done=True)
    assert uploader.finish() and not journal.pending(1, kinds=("over_budget",))
    assert 0 < recording.largest_held_read <= 7
    held = _held_csv(client, uploader.run_id, tmp_path / "dl")
    lines = open(held).read().splitlines()
    assert lines[0] == "name,step,timestamp_ms,value"
    assert lines[1:] == [f"c,{s},{1000 + s},{s + 0.2}" for s in range(30)] + ["c,30,1030,nan"]


def test_a_refusal_of_the_credentials_or_the_run_rejects_no_entry(tmp_path, mlflow_server, client):
    """A 401 on every request (wrong credentials) says nothing about the entries: delivery until done raises it,
    and every entry stays pending for a sync with the right credentials. The one-by-one search for a refused entry
    (added to sync's loop) marked all three rejected for good."""
    from mlflow.exceptions import MlflowException

    from hvd_mlflow.delivery.journal import REJECTED

    journal = _keyed_journal(tmp_path, mlflow_server.url, ["a"], steps=3, final_status="FINISHED")
    uploader = Uploader(journal, _Faulty(client, [], unauthorised=True), MLFLOW)
    with pytest.raises(MlflowException, match="unauthorised"):
        uploader.deliver(until_done=True)
    assert journal.count(REJECTED) == 0 and len(journal.pending(10, kinds=("metrics",))) == 3
