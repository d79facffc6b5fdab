"""Rank 0's background delivery: the training thread journals, a daemon thread uploads.

The training thread only commits entries to the journal and wakes the sender (:meth:`Sender.notify`); it
never waits on the network. The sender thread uploads with :class:`~hvd_mlflow.delivery.Uploader`. After a
failed upload it backs off (1, 2, 4 ... up to 60 s); after three failures in a row the circuit opens: a
warning says so, and the server is only probed every ``max_backoff`` seconds while the journal keeps
everything. The first upload that works closes the circuit and drains the backlog in large requests.
At the end of ``fit``, :meth:`Sender.close` waits a bounded time; what is left stays in the journal, and a
warning gives the ``hvd-mlflow sync`` command that uploads it.
"""

from __future__ import annotations

import threading
import time

from ._log import logger
from .delivery import Uploader, is_permanent
from .journal import Journal
from .limits import Limits
from .redact import mask_uri, redact

OPEN_AFTER_FAILURES = 3
# At most about two uploads a second: epochs shorter than that are packed into one request instead of costing
# rank 0 a request (and the CPU to build it) each. Longer epochs still go one request per epoch, at once.
MIN_SEND_INTERVAL_S = 0.5


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

        journal = Journal.create(directory, meta)
        sender = Sender(journal, "http://127.0.0.1:5000", MLFLOW)
        sender.start()
        journal.append("metrics", {"loss": 0.3}, step=0, timestamp_ms=now_ms)
        sender.notify()
        sender.close("FINISHED", timeout=60)
    """

    def __init__(self, journal: Journal, tracking_uri: str, limits: Limits, max_backoff: float = 60.0) -> None:
        self.journal = journal
        self._tracking_uri = tracking_uri
        self._limits = limits
        self._backoff = Backoff(maximum=max_backoff)
        self._cond = threading.Condition()
        self._wake = False
        self._closing = False
        self._run_opened = threading.Event()
        self._last_send = 0.0
        self.run_id: str | None = journal.meta().get("run_id")
        self.delivered_all = False
        self._thread = threading.Thread(target=self._loop, name="hvd-mlflow-sender", daemon=True)

    # -- training thread -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def notify(self) -> None:
        """New entries are in the journal."""
        with self._cond:
            self._wake = True
            self._cond.notify()

    def wait_for_run(self, timeout: float) -> str | None:
        self._run_opened.wait(timeout)
        return self.run_id

    def close(self, status: str | None, timeout: float) -> bool:
        """Record the training's outcome, wait up to ``timeout`` s for delivery; True if all was delivered."""
        if status:
            self.journal.set_meta({"final_status": status})
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive() or not self.delivered_all:
            left = self.journal.count()
            where = self.journal.path if self.journal.is_file else None
            logger.warning(
                "hvd-mlflow: %d journal entr%s not delivered to %s within %.0f s. %s",
                left,
                "y was" if left == 1 else "ies were",
                mask_uri(self._tracking_uri),
                timeout,
                f"They are kept in {where}; upload them with:  hvd-mlflow sync {where}"
                if where
                else "The journal was in memory only (no writable journal directory): they are lost.",
            )
            return False
        self.journal.delete()
        return True

    # -- sender thread ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        from mlflow import MlflowClient

        journal = self.journal.reopen()
        uploader = Uploader(journal, MlflowClient(self._tracking_uri), self._limits)
        while True:
            with self._cond:
                while not self._closing and not (self._wake and self._pause() == 0):
                    self._cond.wait(self._pause() or None)
                self._wake = False
                closing = self._closing
            self._last_send = time.monotonic()
            try:
                self.run_id = uploader.ensure_run()
                self._run_opened.set()
                while uploader.upload_some():
                    pass
                if self._backoff.succeeded():
                    logger.warning("hvd-mlflow: the tracking server answers again; the backlog was sent")
                if closing and uploader.finish():
                    self.delivered_all = True
                    break
            except Exception as error:  # noqa: BLE001 - the training must never see a tracking error
                if is_permanent(error) and not uploader.run_id:
                    logger.error("hvd-mlflow: cannot open the MLflow run: %s", redact(str(error))[:500])
                    break
                self._failed(error)
                if closing:
                    with self._cond:  # one more try when the backoff allows, until close() gives up
                        self._cond.wait(self._backoff.wait_time())
                else:
                    self._wake = True
        journal.close()

    def _pause(self) -> float:
        """Seconds before the next upload may start: the backoff after failures, else the send interval."""
        interval = MIN_SEND_INTERVAL_S - (time.monotonic() - self._last_send)
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
                self.journal.path,
            )
        elif self._backoff.failures < OPEN_AFTER_FAILURES:
            logger.info("hvd-mlflow: upload failed (%s); retrying in %.0f s", message, delay)
