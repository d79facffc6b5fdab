"""Rank 0's background delivery to the MLflow tracking server.

The training thread only calls :meth:`Sender.put_metrics` / :meth:`Sender.put_params`, which append to
memory and return at once. A daemon thread opens the run (creating it if needed), then sends everything
queued with ``log_batch`` requests within the server's limits, packing several epochs into one request when
it has fallen behind. HTTP retries (408/429/5xx, connection errors, ``Retry-After``) are MLflow's own
(``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` and friends); when a request still fails, the sender warns, waits and
tries again, so nothing is dropped while the process lives. :meth:`Sender.close` waits a bounded time.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping

from . import batching, destination
from ._log import logger, warn_once
from .batching import EpochRecord
from .redact import redact

_MAX_BACKOFF_S = 30.0


class Sender:
    """Deliver one training's params, tags and per-epoch metrics to one MLflow run, off the training thread.

    Example::

        sender = Sender(destination.resolve(None), tags={"team": "vision"})
        sender.start()
        sender.put_metrics(EpochRecord(step=0, timestamp_ms=now_ms, metrics={"loss": 0.7}))
        sender.close(status="FINISHED", timeout=60)
    """

    def __init__(self, dest: destination.Destination, tags: Mapping[str, str] | None = None) -> None:
        self.destination = dest
        self._run_tags = dict(tags or {})
        self._records: collections.deque[EpochRecord] = collections.deque()
        self._params: dict[str, str] = {}
        self._tags: dict[str, str] = {}
        self._cond = threading.Condition()
        self._closing = False
        self._final_status: str | None = None
        self._run_opened = threading.Event()
        self._run_id: str | None = None
        self._created_run = False
        self._failures = 0
        self._thread = threading.Thread(target=self._loop, name="hvd-mlflow-sender", daemon=True)

    # -- training thread -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def wait_for_run(self, timeout: float) -> str | None:
        """The run id once the run is open, or ``None`` if that takes longer than ``timeout`` seconds."""
        self._run_opened.wait(timeout)
        return self._run_id

    def put_metrics(self, record: EpochRecord) -> None:
        with self._cond:
            self._records.append(record)
            self._cond.notify()

    def put_params(self, params: Mapping[str, str]) -> None:
        with self._cond:
            self._params.update(params)
            self._cond.notify()

    def put_tags(self, tags: Mapping[str, str]) -> None:
        with self._cond:
            self._tags.update(tags)
            self._cond.notify()

    def close(self, status: str | None, timeout: float) -> bool:
        """Deliver what is queued within ``timeout`` seconds, then end the run if hvd-mlflow created it.

        Returns whether everything was delivered; if not, a warning says what was left.
        """
        with self._cond:
            self._closing = True
            self._final_status = status
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            with self._cond:
                left = len(self._records)
            logger.warning(
                "hvd-mlflow: %d epoch(s) of metrics were not delivered to %s within %.0f s "
                "(the tracking server is slow or unreachable); they are lost when this process exits. "
                "Raise HVD_MLFLOW_FLUSH_TIMEOUT to wait longer.",
                left,
                self.destination.display_uri,
                timeout,
            )
            return False
        return True

    @property
    def run_id(self) -> str | None:
        return self._run_id

    # -- sender thread ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        from mlflow import MlflowClient

        client = MlflowClient(self.destination.tracking_uri)
        while True:
            with self._cond:
                while not (self._closing or self._has_work()):
                    self._cond.wait()
                if self._closing and not self._has_work() and self._run_opened.is_set():
                    break
            try:
                if not self._run_opened.is_set():
                    self._run_id, self._created_run = destination.open_run(
                        client, self.destination, self._run_tags
                    )
                    self._run_opened.set()
                    logger.info(
                        "hvd-mlflow: logging to run %s at %s", self._run_id, self.destination.display_uri
                    )
                self._deliver(client)
                self._failures = 0
            except Exception as error:  # noqa: BLE001 - the training must never see a tracking error
                self._failures += 1
                warn_once(
                    f"deliver:{type(error).__name__}",
                    "hvd-mlflow: could not log to %s (%s: %s); training goes on and logging is retried "
                    "in the background",
                    self.destination.display_uri,
                    type(error).__name__,
                    redact(str(error))[:500],
                )
                with self._cond:
                    self._cond.wait(min(_MAX_BACKOFF_S, 2.0**self._failures))
        self._end_run(client)

    def _has_work(self) -> bool:
        return bool(self._records or self._params or self._tags)

    def _deliver(self, client) -> None:
        from mlflow.entities import Metric, Param, RunTag

        with self._cond:
            entries = [("param", k, v) for k, v in self._params.items()]
            entries += [("tag", k, v) for k, v in self._tags.items()]
        for part in batching.chunks(entries):
            client.log_batch(
                self._run_id,
                params=[Param(k, v) for kind, k, v in part if kind == "param"],
                tags=[RunTag(k, v) for kind, k, v in part if kind == "tag"],
            )
            with self._cond:
                for kind, key, value in part:
                    pending = self._params if kind == "param" else self._tags
                    if pending.get(key) == value:
                        del pending[key]
        with self._cond:
            records = list(self._records)
        for request in batching.metric_requests(records):
            client.log_batch(self._run_id, metrics=[Metric(*point) for point in request.points])
            with self._cond:
                for _ in range(request.completes):
                    self._records.popleft()

    def _end_run(self, client) -> None:
        if self._created_run and self._final_status and not self.destination.job_mode:
            try:
                end_ms = int(time.time() * 1000)
                client.set_terminated(self._run_id, status=self._final_status, end_time=end_ms)
            except Exception as error:  # noqa: BLE001
                logger.warning("hvd-mlflow: could not end run %s: %s", self._run_id, redact(str(error)))
