"""The sender thread's life: it always ends, never spins, stops sending when told, waits little for a dead server.

The client is a fake (only the calls the uploader makes), so what is tested is the thread and its clock."""

from __future__ import annotations

import threading
import time

import pytest

from hvd_mlflow.delivery import sender as sender_module
from hvd_mlflow.delivery.journal import FileJournal, JournalMeta, LiveJournal
from hvd_mlflow.delivery.limits import MLFLOW
from hvd_mlflow.delivery.reachability import cannot_answer
from hvd_mlflow.delivery.sender import Backoff, Sender

# waits bounded to fractions of a second (alone); a fake client: no Keras, no MLflow version in it (once)
pytestmark = [pytest.mark.alone, pytest.mark.once]


class FakeClient:
    """Answers log_batch after ``delay`` seconds (or never, while ``blocked`` is set); records every call."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[str] = []
        self.points = 0
        self.blocked = threading.Event()
        self.release = threading.Event()

    def log_batch(self, run_id, metrics=(), params=(), tags=(), **kwargs):
        self.calls.append("log_batch")
        self.points += len(metrics)
        if self.blocked.is_set():
            self.release.wait(30)
        time.sleep(self.delay)

    def get_run(self, run_id):
        raise AssertionError("not asked in these tests (resume='log')")


@pytest.fixture
def fake(monkeypatch):
    client = FakeClient()
    monkeypatch.setattr("mlflow.MlflowClient", lambda uri: client)
    # "http://fake" resolves nowhere, so the end of fit's probe would find it down: it has tests of its own
    monkeypatch.setattr(sender_module.reachability, "cannot_answer", lambda *args, **kwargs: False)
    return client


def make_sender(tmp_path) -> Sender:
    meta = JournalMeta.new(tracking_uri="http://fake", run_id="run-1", resume="log")
    return Sender(LiveJournal(FileJournal.create(tmp_path, meta)), "http://fake", MLFLOW)


def started_with_one_point(tmp_path) -> Sender:
    """A started sender woken for one journaled point (not begun: as at train begin, before the first epoch ends)."""
    sender = make_sender(tmp_path)
    sender.start()
    sender.journal.append("metrics", {"loss": 1.0}, step=0, timestamp_ms=1)
    sender.notify()
    return sender


def test_backoff_grows_and_opens_the_circuit():
    backoff = Backoff(first=1, maximum=8)
    assert [backoff.failed() for _ in range(5)] == [1, 2, 4, 8, 8]
    assert backoff.is_open
    assert backoff.succeeded() is True and not backoff.is_open and backoff.wait_time() == 0


def test_closed_without_a_status_the_thread_ends_and_does_not_spin(tmp_path, fake):
    """An elastic reset closes a sender with no outcome (the run goes on): it delivers, then ends."""
    sender = started_with_one_point(tmp_path)
    cpu = time.thread_time()
    assert sender.close(None, deadline=time.monotonic() + 10) is True
    assert not sender.alive and fake.calls == ["log_batch"]
    assert time.thread_time() - cpu < 1.0


def test_after_the_deadline_it_stops_and_sends_nothing_more(tmp_path, fake):
    sender = make_sender(tmp_path)
    fake.blocked.set()  # the server holds the request (MLflow's own retries, a slow server)
    sender.start()
    sender.begin()
    sender.journal.append("metrics", {"loss": 1.0}, step=0, timestamp_ms=1)
    sender.notify()
    while not fake.calls:
        time.sleep(0.01)
    sender.journal.append("metrics", {"loss": 0.5}, step=1, timestamp_ms=2)
    start = time.monotonic()
    assert sender.close("FINISHED", deadline=time.monotonic() + 1.0) is False
    assert time.monotonic() - start < 1.5
    fake.release.set()  # the request in flight returns...
    for _ in range(100):
        if not sender.alive:
            break
        time.sleep(0.05)
    assert not sender.alive and fake.calls == ["log_batch"]  # ...and the thread ends without another request


def test_a_server_that_never_answered_costs_the_end_of_fit_a_few_seconds(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(sender_module, "UNANSWERED_S", 0.5)
    monkeypatch.setattr(sender_module, "DOWN_GRACE_S", 0.5)
    sender = make_sender(tmp_path)
    fake.blocked.set()
    sender.start()
    sender.begin()
    sender.journal.append("metrics", {"loss": 1.0}, step=0, timestamp_ms=1)
    sender.notify()
    time.sleep(0.7)  # the first request has waited longer than UNANSWERED_S: the server is known down
    assert sender.server_down()
    start = time.monotonic()
    assert sender.close("FINISHED", deadline=time.monotonic() + 60) is False
    assert time.monotonic() - start < 1.5  # not the 60 s of flush_timeout
    fake.release.set()


def test_an_address_that_refuses_connections_is_known_down_at_the_end_of_fit_without_waiting_for_the_call(
    tmp_path, fake, monkeypatch
):
    """A server down for the whole run: MLflow's client retries the refused connection for minutes, so the call in
    flight neither answers nor fails (the fake blocks as it does). At the end of fit the address itself is asked:
    refused, so only DOWN_GRACE_S is waited, not UNANSWERED_S first (before: 6 s + 3 s, whatever the call's age)."""
    from tests.support.mlflow_server import free_port

    monkeypatch.setattr(sender_module.reachability, "cannot_answer", cannot_answer)  # the real probe
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    sender = Sender(LiveJournal(FileJournal.create(tmp_path, JournalMeta.new(tracking_uri=uri, run_id="run-1",
                                                                             resume="log"))), uri, MLFLOW)  # fmt: skip
    fake.blocked.set()
    sender.start()
    sender.begin()
    sender.journal.append("metrics", {"loss": 1.0}, step=0, timestamp_ms=1)
    sender.notify()
    for _ in range(100):  # the first call is in flight (and would stay so for minutes)
        if fake.calls:
            break
        time.sleep(0.02)
    assert fake.calls and not sender.server_down()  # the call has not waited UNANSWERED_S: not known down by it
    start = time.monotonic()
    assert sender.close("FINISHED", deadline=time.monotonic() + 60) is False
    took = time.monotonic() - start
    assert sender_module.DOWN_GRACE_S - 0.3 <= took < sender_module.DOWN_GRACE_S + 1.0, took
    assert sender.server_down()
    fake.release.set()


def test_the_model_s_wait_for_a_run_ends_when_the_address_refuses_and_the_grace_is_counted_once(
    tmp_path, fake, monkeypatch
):
    """The end of fit first waits for a run to log the model in (up to run_wait), then delivers. With the server's
    address refusing from the start, the wait for the run ends once the probe says so, and the delivery's grace is
    counted from that moment, not again (before: run_wait, 5 s, then the probe and DOWN_GRACE_S: 8-10 s in all)."""
    from tests.support.mlflow_server import free_port

    monkeypatch.setattr(sender_module.reachability, "cannot_answer", cannot_answer)  # the real probe
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    sender = Sender(LiveJournal(FileJournal.create(tmp_path, JournalMeta.new(tracking_uri=uri, run_id=None,
                                                                             resume="log"))), uri, MLFLOW)  # fmt: skip
    fake.blocked.set()
    sender.start()
    sender.journal.append("metrics", {"loss": 1.0}, step=0, timestamp_ms=1)
    start = time.monotonic()
    assert sender.wait_for_run_at_end(time.monotonic() + 30) is None
    waited = time.monotonic() - start
    assert waited < 1.0, waited
    assert sender.close("FINISHED", deadline=time.monotonic() + 60) is False
    took = time.monotonic() - start
    assert sender_module.DOWN_GRACE_S - 0.3 <= took < sender_module.DOWN_GRACE_S + 0.8, (waited, took)
    fake.release.set()


def test_asking_the_server_knows_a_refusing_address_down_and_an_answering_server_not(tmp_path):
    """cannot_answer (the end of fit asks it before a model upload): a closed port is known down at once, and stays
    so for close(); a server that answers is not."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.support.mlflow_server import free_port

    class Ok(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        for answering, port in ((False, free_port()), (True, httpd.server_address[1])):
            uri = f"http://127.0.0.1:{port}"
            sender = Sender(LiveJournal(FileJournal.create(tmp_path / str(answering), JournalMeta.new(
                tracking_uri=uri, run_id="run-1", resume="log"))), uri, MLFLOW)  # fmt: skip
            start = time.monotonic()
            assert sender.cannot_answer() is (not answering)
            assert time.monotonic() - start < 1.0
            assert sender.server_down() is (not answering)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_known_down_at_the_end_of_fit_stays_down_for_close_whatever_a_new_attempt_does(tmp_path, fake):
    """The model's step finds the server down (the call in flight has waited UNANSWERED_S); then that call ends and
    close()'s one new attempt starts a young call that says nothing yet. The grace counts from the first moment it
    was known down: close() returns DOWN_GRACE_S after it, not at its deadline (seen in the suite: the end of fit 5 s,
    the grace restarted by the probe's cadence; with this fake's address that never refuses: the whole deadline)."""
    sender = started_with_one_point(tmp_path)
    fake.blocked.set()
    sender.begin()
    for _ in range(100):
        if fake.calls:
            break
        time.sleep(0.02)
    assert fake.calls
    sender._call_since = time.monotonic() - sender_module.UNANSWERED_S - 1  # it has waited that long (white box)
    assert sender.known_down()
    known = time.monotonic()
    sender._call_since = time.monotonic()  # that call ended, a new one began: young, no answer (white box)
    assert not sender.server_down()
    assert sender.close("FINISHED", deadline=time.monotonic() + 20) is False
    took = time.monotonic() - known
    assert took < sender_module.DOWN_GRACE_S + 0.5, took
    fake.release.set()


def test_nothing_is_imported_or_sent_before_the_first_epoch_ends_then_at_once(tmp_path, fake, monkeypatch):
    """The thread holds MLflow's import and its first request until begin() (the callback's first epoch commit):
    they would take half the training thread's time while Keras traces its functions in the first epoch."""
    begun = []
    original = sender_module.mlflow_calls.internal
    monkeypatch.setattr(sender_module.mlflow_calls, "internal", lambda: begun.append(1) or original())
    sender = started_with_one_point(tmp_path)  # woken by the run's tags or a batch flush before the epoch ends
    time.sleep(0.5)
    assert fake.calls == [] and begun == []  # woken, but held
    sender.begin()
    for _ in range(100):
        if fake.calls:
            break
        time.sleep(0.02)
    assert fake.calls == ["log_batch"] and begun == [1]
    assert sender.close("FINISHED", deadline=time.monotonic() + 10) is True


def test_a_long_first_epoch_holds_the_sender_only_start_after_s(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(sender_module, "START_AFTER_S", 0.3)
    start = time.monotonic()
    sender = started_with_one_point(tmp_path)
    while not fake.calls and time.monotonic() - start < 5:
        time.sleep(0.02)
    assert fake.calls == ["log_batch"] and 0.3 <= time.monotonic() - start < 2.0  # no begin(): the timer
    assert sender.close("FINISHED", deadline=time.monotonic() + 10) is True


def test_a_fit_that_ends_before_its_first_epoch_does_delivers(tmp_path, fake):
    sender = started_with_one_point(tmp_path)
    start = time.monotonic()
    assert sender.close("FINISHED", deadline=time.monotonic() + 10) is True  # close() lets it begin
    assert fake.calls == ["log_batch"] and time.monotonic() - start < 2.0


def test_a_sender_that_never_started_releases_its_journal(tmp_path, fake):
    sender = make_sender(tmp_path)
    sender.journal.append("metrics", {"loss": 1.0}, step=0, timestamp_ms=1)
    path = sender.journal.file.path
    assert sender.close("FINISHED", deadline=time.monotonic() + 0.1) is False
    again = FileJournal.open(path)
    assert again.take_over() and again.count() == 1 and again.meta().final_status == "FINISHED"


def test_short_epochs_are_packed_one_request_per_send_interval(tmp_path, fake):
    """Epochs ending every 20 ms against a server answering in 50 ms: the sender sends at most one request per
    MIN_SEND_INTERVAL_S (what arrives during a request waits for the next one), not one per epoch."""
    fake.delay = 0.05
    sender = make_sender(tmp_path)
    sender.start()
    sender.begin()
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < 2.0:
        sender.journal.append("metrics", {"loss": 1.0 / (step + 1)}, step=step, timestamp_ms=step + 1)
        sender.notify()
        step += 1
        time.sleep(0.02)
    elapsed = time.monotonic() - start
    during = len(fake.calls)
    assert sender.close("FINISHED", deadline=time.monotonic() + 10) is True
    assert fake.points == step  # every epoch delivered, once
    allowed = int(elapsed / sender_module.MIN_SEND_INTERVAL_S) + 1
    assert during <= allowed, f"{during} requests for {step} epochs in {elapsed:.2f} s (at most {allowed})"


def test_a_sender_that_cannot_open_the_run_ends_and_close_says_what_is_kept(tmp_path, monkeypatch, caplog):
    """A permanent refusal of the run (a 400 when it is created) ends the sender thread, which releases the journal:
    close() must still return (False) and say where the entries are kept, not raise on the released journal (seen:
    'this journal was released (its sender ended)' out of close(), in a fit's end)."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    class Refusing:
        def search_runs(self, *args, **kwargs):
            return []

        def create_run(self, *args, **kwargs):
            raise MlflowException("refused for good", error_code=INVALID_PARAMETER_VALUE)

        def __getattr__(self, name):
            raise AssertionError(f"not asked: {name}")

    monkeypatch.setattr("mlflow.MlflowClient", lambda uri: Refusing())
    meta = JournalMeta.new(tracking_uri="http://fake", experiment_id="1", resume="log")
    sender = Sender(LiveJournal(FileJournal.create(tmp_path, meta)), "http://fake", MLFLOW)
    sender.start()
    sender.journal.append("metrics", {"loss": 1.0}, step=0, timestamp_ms=1)
    sender.notify()
    sender.begin()
    deadline = time.monotonic() + 10
    while sender.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sender.alive  # it gave up on the run
    with caplog.at_level("WARNING", logger="hvd_mlflow"):
        assert sender.close("FINISHED", deadline=time.monotonic() + 5) is False
    assert "hvd-mlflow sync" in caplog.text and str(tmp_path) in caplog.text
    assert list(tmp_path.glob("*.journal.sqlite"))  # kept for sync


def test_a_server_that_answered_then_went_silent_costs_the_end_of_fit_a_few_seconds(tmp_path, fake, monkeypatch):
    """A tracking host gone from the network mid-run (it answered every request until then): its next request
    hangs. Seen in the two-node tf.distribute test: the end of fit waited the whole flush_timeout (61.8 s), the
    server never counted as down because it had answered before."""
    monkeypatch.setattr(sender_module, "UNANSWERED_S", 0.5)
    monkeypatch.setattr(sender_module, "DOWN_GRACE_S", 0.5)
    monkeypatch.setattr(sender_module, "MIN_SEND_INTERVAL_S", 0.0)
    sender = make_sender(tmp_path)
    sender.start()
    sender.begin()
    sender.journal.append("metrics", {"loss": 1.0}, step=0, timestamp_ms=1)
    sender.notify()
    for _ in range(100):
        if fake.points:
            break
        time.sleep(0.02)
    assert fake.points == 1 and not sender.server_down()  # answered at once
    fake.blocked.set()  # from now on the server does not answer
    sender.journal.append("metrics", {"loss": 0.5}, step=1, timestamp_ms=2)
    sender.notify()
    time.sleep(0.8)  # the call in flight has waited UNANSWERED_S, and far longer than any answer before
    assert sender.server_down()
    start = time.monotonic()
    assert sender.close("FINISHED", deadline=time.monotonic() + 60) is False
    assert time.monotonic() - start < 1.5  # not the 60 s of flush_timeout
    fake.release.set()


def test_a_slow_server_that_answers_is_not_taken_for_a_silent_one(tmp_path, monkeypatch):
    """Answers that take long (a throttled or distant server) raise the bar: a call waiting less than
    SILENT_FACTOR times the slowest answer so far is still expected to come back."""
    monkeypatch.setattr(sender_module, "UNANSWERED_S", 0.1)
    sender = make_sender(tmp_path)
    sender._answered_after(time.monotonic() - 0.5)  # an answer that took 0.5 s
    sender._call_since = time.monotonic() - 1.0  # a call waiting 1 s: under 4 x 0.5 s
    assert not sender.server_down()
    sender._call_since = time.monotonic() - 2.5  # 2.5 s: over 4 x 0.5 s and UNANSWERED_S
    assert sender.server_down()
