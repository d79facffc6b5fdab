"""Rank 0's background delivery: the training thread journals, a daemon thread uploads.

The training thread only commits entries to the journal and wakes the sender (:meth:`Sender.notify`); it
never waits on the network. The thread starts at train begin but holds MLflow's import and its first request
until the first epoch has ended (:meth:`Sender.begin`) or :data:`START_AFTER_S` have passed: in the first epoch
the training thread traces Keras' functions in Python, and an import beside it (about a second of Python, holding
the GIL) would take about half of that thread's time, on the first epoch's critical path; once the functions are
traced the training thread mostly waits in TensorFlow with the GIL released.

The sender thread uploads with :class:`~hvd_mlflow.delivery.uploader.Uploader`. After a failed upload it backs off
(1, 2, 4 ... up to 60 s); after three failures in a row the circuit opens: a warning says so, and the server is
only probed every ``max_backoff`` seconds while the journal keeps
everything. The first upload that works closes the circuit and drains the backlog in large requests.

The thread always ends: :meth:`Sender.close` records the training's outcome and waits until a deadline (only a
few seconds once the sender knows the server does not answer); past it the thread stops after the request in
flight, what is left stays in the journal, and a warning gives the ``hvd-mlflow sync`` command that uploads it.
:meth:`Sender.stop` (an elastic reset) stops it without waiting for delivery. When the thread ends it releases
the journal's writer lock, so ``sync`` may take over.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from .._log import logger
from ..common.redact import mask_uri, redact
from . import mlflow_calls, reachability
from .journal import LiveJournal
from .journal.finding import JOB_DIRECTORY
from .limits import Limits
from .server_answers import http_status, is_permanent
from .uploader import Uploader

OPEN_AFTER_FAILURES = 3
# At most about two uploads a second: epochs shorter than that are packed into one request instead of costing
# rank 0 a request (and the CPU to build it) each. Longer epochs still go one request per epoch, at once.
MIN_SEND_INTERVAL_S = 0.5
# The server is known not to answer when the circuit is open, or when a call has waited UNANSWERED_S and
# SILENT_FACTOR times the slowest answer this sender had (a server that answered before and went silent, a host
# gone from the network, is known too). Then the end of ``fit`` waits only DOWN_GRACE_S more.
UNANSWERED_S = 6.0
SILENT_FACTOR = 4.0
DOWN_GRACE_S = 3.0
# At the end of fit, while no call has been answered (or the one in flight has waited PROBE_AFTER_S), the server is
# asked directly, every PROBE_EVERY_S, with one request without retries: an address that refuses, a front that closes
# the connection without an answer or answers 5xx is known down at once (MLflow's client would retry it for minutes:
# delivery/reachability.py).
PROBE_AFTER_S = 1.0
PROBE_EVERY_S = 2.0
# The longest the sender holds MLflow's import and the run back when the first epoch is long: a run the sender
# creates is visible in the UI by then, and Keras' tracing, at the epoch's start, is over.
START_AFTER_S = 10.0


class Backoff:
    """Exponential backoff that turns into an open circuit after repeated failures."""

    def __init__(self, first: float = 1.0, maximum: float = 60.0) -> None:
        self.first, self.maximum = first, maximum
        self.failures = 0
        self.retry_at = 0.0

    @property
    def is_open(self) -> bool:
        return self.failures >= OPEN_AFTER_FAILURES

    def failed(self) -> float:
        self.failures += 1
        delay = min(self.maximum, self.first * 2.0 ** (self.failures - 1))
        self.retry_at = time.monotonic() + delay
        return delay

    def succeeded(self) -> bool:
        """Reset; returns whether the circuit was open."""
        was_open = self.is_open
        self.failures, self.retry_at = 0, 0.0
        return was_open

    def wait_time(self) -> float:
        return max(0.0, self.retry_at - time.monotonic())


class Sender:
    """Upload a journal to a tracking server from a daemon thread.

    Example::

        journal = LiveJournal.open_new(directory, JournalMeta.new(tracking_uri="http://127.0.0.1:5000"))
        sender = Sender(journal, "http://127.0.0.1:5000", MLFLOW)
        sender.start()
        journal.append("metrics", {"loss": 0.3}, step=0, timestamp_ms=now_ms)
        sender.notify()
        sender.close("FINISHED", deadline=time.monotonic() + 60)
    """

    def __init__(
        self,
        journal: LiveJournal,
        tracking_uri: str | None,
        limits: Limits,
        max_backoff: float = 60.0,
        context_tags: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self.journal = journal
        self._context_tags = context_tags  # the tags of a run it creates, read on its thread before the first request
        self._tracking_uri = tracking_uri
        self._limits = limits
        self._backoff = Backoff(maximum=max_backoff)
        self._cond = threading.Condition()
        self._wake = False
        self._closing = False
        self._stopping = False
        self._run_opened = threading.Event()
        self._begun = threading.Event()  # the first epoch is over (or the fit is): MLflow's import may start
        self._last_send = 0.0
        # The record of the server's answers, written by the sender's thread (each call) and the end of fit's probe
        # threads, read by the training thread: under this lock. The end of fit's own state (_probed_at, _asking,
        # _down_since, _answers_when_down) belongs to the training thread alone.
        self._health = threading.Lock()
        self._call_since: float | None = None  # when the server call in flight began
        self._slowest_answer_s = 0.0  # the longest this sender waited for an answer (0: none yet)
        # how many calls the server answered (even with a refusal; a 5xx is no answer: no data taken)
        self._answers = 0
        self._unreachable = False  # at the end of fit, the server could not answer (reachability.cannot_answer)
        self._probed_at = float("-inf")  # when the end of fit last asked the server (reachability.cannot_answer)
        self._asking: threading.Thread | None = None  # cannot_answer()'s question, maybe still waiting for its answer
        self._down_since: float | None = None  # since when the end of fit has known the server down
        self._answers_when_down = 0  # the answer count then: only an answer since ends that knowledge
        self.run_id: str | None = journal.meta().run_id
        self._job_mode = journal.meta().job_mode  # an AzureML job: what is left is kept with the job (./outputs)
        self.delivered_all = False
        self._thread = threading.Thread(target=self._loop, name="hvd-mlflow-sender", daemon=True)

    # -- training thread -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the thread (once; later calls do nothing)."""
        if self._thread.ident is None:
            self._thread.start()

    def begin(self) -> None:
        """Let the thread import MLflow and open the run now (the first epoch is over, or the run is needed)."""
        self._begun.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def notify(self) -> None:
        """New entries are in the journal."""
        with self._cond:
            self._wake = True
            self._cond.notify()

    def wait_for_run(self, timeout: float) -> str | None:
        self._begun.set()  # the run is needed now
        self._run_opened.wait(max(0.0, timeout))
        return self.run_id

    def wait_for_run_at_end(self, deadline: float) -> str | None:
        """At the end of fit: the run's id once opened, or ``None`` at ``deadline`` (``time.monotonic()``) or as soon as
        the server is known down (its address is asked meanwhile, as :meth:`close` does)."""
        self._begun.set()

        def opened_or_gone() -> bool:  # or the sender ended (a permanent refusal): nothing will open it
            return self._run_opened.is_set() or not self._thread.is_alive()

        self._wait_at_end(opened_or_gone, self._run_opened.wait, deadline, grace=0.0)
        return self.run_id

    def server_down(self) -> bool:
        """The sender's own evidence that the server does not answer: the circuit is open, the end of fit's probe
        found it unable to answer (refused, closed without an answer, 5xx), or the call in flight has waited
        :data:`UNANSWERED_S` and :data:`SILENT_FACTOR` times the slowest answer so far."""
        with self._health:
            if self._backoff.is_open or self._unreachable:
                return True
            since, slowest = self._call_since, self._slowest_answer_s
        waited = time.monotonic() - since if since is not None else 0.0
        return waited > max(UNANSWERED_S, SILENT_FACTOR * slowest)

    def _calling(self, started: float | None) -> None:
        """The sender's thread: a call to the server began at ``started`` (``None``: it ended)."""
        with self._health:
            self._call_since = started

    def _answered_after(self, started: float) -> None:
        with self._health:
            self._answers += 1  # a probe that began before this answer sees it (_ask_address)
            self._unreachable = False
            self._slowest_answer_s = max(self._slowest_answer_s, time.monotonic() - started)

    def _probe(self) -> bool:
        """At the end of fit, while no answer came (or the call in flight has waited :data:`PROBE_AFTER_S`): ask, on a
        short-lived thread, whether the server can answer (reachability.cannot_answer). True if asked."""
        with self._health:
            since, unreachable, answered = self._call_since, self._unreachable, self._answers > 0
        waiting = since is not None and time.monotonic() - since > PROBE_AFTER_S
        if unreachable or not (waiting or not answered):
            return False
        threading.Thread(target=self._ask_address, name="hvd-mlflow-probe", daemon=True).start()
        return True

    def cannot_answer(self, wait: float = reachability.TIMEOUT_S + 0.5) -> bool:
        """Whether the server cannot answer (reachability.cannot_answer), asked now on a short-lived thread and waited
        for at most ``wait`` (a slow name lookup is not an answer): if so it is known down from now on, until it
        answers a call. A question asked before and still waiting is waited for again, not asked twice."""
        asking = self._asking
        if asking is None or not asking.is_alive():
            asking = self._asking = threading.Thread(target=self._ask_address, name="hvd-mlflow-probe", daemon=True)
            asking.start()
        asking.join(wait)
        with self._health:
            return self._unreachable

    def _ask_address(self) -> None:
        """A probe thread: the server cannot answer, unless it answered a call while it was asked."""
        with self._health:
            answers = self._answers
        if reachability.cannot_answer(self._tracking_uri):
            with self._health:
                self._unreachable = self._answers == answers

    def close(self, status: str | None, deadline: float) -> bool:
        """Record the training's outcome (``None``: leave the run as it is), wait for delivery until
        ``deadline`` (``time.monotonic()``), or :data:`DOWN_GRACE_S` once the server is known down; then stop.
        True if everything was delivered."""
        try:
            # no status: leave the run as it is, nothing to end once delivered
            self.journal.update_meta(**({"final_status": status} if status else {"ended": True}))
        finally:
            self._note_down(time.monotonic())  # known down already: the grace counts from now, whatever the attempt
            with self._cond:
                self._closing = True
                self._backoff.retry_at = 0.0  # one attempt now, whatever the backoff said
                self._cond.notify()
            self._begun.set()
        self._wait_at_end(lambda: not self._thread.is_alive(), self._thread.join, deadline, grace=DOWN_GRACE_S)
        if not self._thread.is_alive() and self.delivered_all:
            self._release()  # written back, not deleted, when the file keeps entries memory let go
            if not self.journal.left_in_file:
                return True
            self._warn_undelivered(self.journal.left_in_file)
            return False
        left = self.journal.count()
        self.stop(wait=0)
        self.journal.checkpoint()  # the file the warning names holds everything by itself (the thread may go on)
        self._warn_undelivered(left)
        return False

    def _wait_at_end(
        self, done: Callable[[], bool], pause: Callable[[float], object], deadline: float, grace: float
    ) -> None:
        """Until ``done()``, ``deadline``, or ``grace`` seconds after the server is first known down (kept across the
        end of fit's waits: the model's, then the delivery's), asking its address every :data:`PROBE_EVERY_S`."""
        while not done():
            now = time.monotonic()
            if now - self._probed_at >= PROBE_EVERY_S and self._probe():  # the next in PROBE_EVERY_S, if asked now
                self._probed_at = now
            self._note_down(now)
            limit = deadline if self._down_since is None else min(deadline, self._down_since + grace)
            if now >= limit:
                return
            pause(min(0.2, limit - now))

    def known_down(self) -> bool:
        """At the end of fit: whether the server is known down now; from then on the end's grace counts (close())."""
        self._note_down(time.monotonic())
        return self._down_since is not None

    def _note_down(self, now: float) -> None:
        """At the end of fit: the server is known down from the first moment :meth:`server_down` says so, until it
        answers a call (a new attempt alone, which makes the call in flight young again, does not undo it)."""
        down = self.server_down()
        with self._health:
            answers = self._answers
        if down:
            if self._down_since is None:
                self._down_since, self._answers_when_down = now, answers
        elif self._down_since is not None and answers != self._answers_when_down:
            self._down_since = None

    def stop(self, wait: float = 0.0) -> None:
        """Stop after the request in flight (if any), without delivering the rest; it stays in the journal."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._begun.set()
        if self._thread.is_alive():
            self._thread.join(wait)
        if not self._thread.is_alive():  # ended (or never started): nothing else will release the journal
            self._release()

    def _release(self) -> None:
        self.journal.release(delete=self.delivered_all)

    def _warn_undelivered(self, left: int) -> None:
        logger.warning(
            "hvd-mlflow: %d journal entr%s not delivered to %s%s. %s",
            left,
            "y was" if left == 1 else "ies were",
            mask_uri(self._tracking_uri) if self._tracking_uri else "MLflow's default tracking URI",
            " (the server does not answer)" if self.server_down() else "",
            _where_left(self.journal, self._job_mode),
        )

    # -- sender thread ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            self._begun.wait(START_AFTER_S)
            if self._stopping:
                return
            from mlflow import MlflowClient

            if self._tracking_uri is None:  # MLflow's default: resolved here, off the training thread, and journaled
                from mlflow import get_tracking_uri

                self._tracking_uri = get_tracking_uri()
                self.journal.update_meta(tracking_uri=mask_uri(self._tracking_uri))
            if self._context_tags is not None and self.run_id is None:
                tags = self._context_tags()
                if tags:  # the journal's own tags (set by whoever made it) win
                    self.journal.update_meta(run_tags={**tags, **self.journal.meta().run_tags})
            with mlflow_calls.internal():  # hvd-mlflow's own requests: never silenced by the guard on other ranks
                client = _NoticingAnswers(MlflowClient(self._tracking_uri), self)
                uploader = Uploader(self.journal, client, self._limits, should_stop=lambda: self._stopping)
                while self._deliver_once(uploader):
                    pass
        except Exception as error:  # noqa: BLE001 - never let the thread die with a traceback in the training
            logger.warning("hvd-mlflow: the sender stopped: %s: %s", type(error).__name__, redact(str(error))[:300])
        finally:
            if self._closing or self._stopping:  # else the training thread still journals: close() releases
                self._release()

    def _deliver_once(self, uploader: Uploader) -> bool:
        """Wait for work, upload what is pending; False when the thread should end."""
        with self._cond:
            while not self._stopping:
                pause = self._pause()
                if (self._wake or self._closing) and pause == 0:
                    break
                self._cond.wait(pause if pause > 0 else None)
            if self._stopping:
                return False
            self._wake = False
            closing = self._closing
        self._last_send = time.monotonic()
        try:
            self.run_id = uploader.run.ensure_run()
            self._run_opened.set()
            settled = uploader.deliver(until_done=closing)  # while training, short epochs are packed
            if self._backoff.succeeded():
                logger.warning("hvd-mlflow: the tracking server answers again; the backlog was sent")
            if closing and not self._stopping:
                if uploader.finish():
                    self.delivered_all = True
                    return False
                if not settled:  # nothing moved: do not spin
                    with self._cond:
                        self._cond.wait(MIN_SEND_INTERVAL_S)
        except Exception as error:  # noqa: BLE001 - the training must never see a tracking error
            if is_permanent(error) and not uploader.run_id:
                logger.error("hvd-mlflow: cannot open the MLflow run: %s", redact(str(error))[:500])
                return False
            self._failed(error)
            self._wake = True  # try again when the backoff allows
        return True

    def _pause(self) -> float:
        """Seconds before the next upload may start: the backoff after failures, else the send interval (not
        when closing: then only the backoff)."""
        interval = 0.0 if self._closing else MIN_SEND_INTERVAL_S - (time.monotonic() - self._last_send)
        return max(self._backoff.wait_time(), interval, 0.0)

    def _failed(self, error: BaseException) -> None:
        delay = self._backoff.failed()
        message = f"{type(error).__name__}: {redact(str(error))[:300]}"
        if self._backoff.failures == OPEN_AFTER_FAILURES:
            logger.warning(
                "hvd-mlflow: the tracking server at %s failed %d times in a row (%s); pausing uploads, "
                "probing every %.0f s at most. Training goes on; every epoch is kept in journal %s.",
                mask_uri(self._tracking_uri),
                self._backoff.failures,
                message,
                self._backoff.maximum,
                self.journal.location,
            )
        elif self._backoff.failures < OPEN_AFTER_FAILURES:
            logger.info("hvd-mlflow: upload failed (%s); retrying in %.0f s", message, delay)


class _NoticingAnswers:
    """An ``MlflowClient`` that tells the sender each time the server answered a call."""

    def __init__(self, client: object, sender: Sender) -> None:
        self._client = client
        self._sender = sender

    def __getattr__(self, name: str) -> object:
        attribute = getattr(self._client, name)
        if not callable(attribute) or name.startswith("_"):
            return attribute

        def call(*args: object, **kwargs: object) -> object:
            sender = self._sender
            started = time.monotonic()
            sender._calling(started)
            try:
                result = attribute(*args, **kwargs)
            except Exception as error:
                status = http_status(error)
                if status is not None and status < 500:  # an answer, even a refusal, means the server is up; a 5xx
                    sender._answered_after(started)  # (or MLflow's retries given up on them) means it cannot take data
                raise
            finally:
                sender._calling(None)
            sender._answered_after(started)
            return result

        return call


def _where_left(journal: LiveJournal, job_mode: bool) -> str:
    """Where the entries the end of fit could not deliver are kept, and how to deliver them."""
    dropped = journal.dropped_points
    lost = (f", as are {dropped} older values journaled in memory that it could not hold" if dropped else "") + (
        ". Set journal_dir (HVD_MLFLOW_JOURNAL_DIR) to a writable local folder with room."
    )
    if journal.in_memory and journal.file is not None:
        return (
            f"The journal moved to memory when {journal.file.path} failed; they are written back there if it can be "
            f"written again (then:  hvd-mlflow sync {journal.file.path}), else they are lost{lost}"
        )
    if journal.in_memory:
        return f"The journal was in memory only (no writable journal directory): they are lost{lost}"
    if job_mode and Path(journal.location).parent == JOB_DIRECTORY:
        return (
            f"They are kept in {journal.location}, which AzureML uploads into the job's run with ./outputs when the "
            "job ends: download it (Studio: the job's Outputs + logs; or  az ml job download --name <job> "
            "--download-path <d>, which puts it under <d>/artifacts/), then, logged in to Azure (az login):  "
            f"hvd-mlflow sync <d>/artifacts/{journal.location}  (the journal knows the workspace)"
        )
    return f"They are kept in {journal.location}; upload them with:  hvd-mlflow sync {journal.location}"
