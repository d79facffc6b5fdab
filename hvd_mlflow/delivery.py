"""Upload a journal's pending entries into its MLflow run, idempotently.

Used by rank 0's background sender while training runs and by ``hvd-mlflow sync`` afterwards. Every step can
be repeated without harm:

* the run: the one recorded in the journal; else a run carrying the journal's id as a tag (found again
  after a create whose answer was lost); else a new one, tagged with that id;
* params and tags: sending the same value twice is a no-op for MLflow;
* metrics: each point keeps the timestamp it was measured at, so a resend is the *same* point (MLflow's SQL
  store drops exact duplicates). Servers that would store it twice (AzureML accepts several values at one
  step) are covered by checking, after any failed request, whether it was applied before resending it.

Resuming (``resume="skip"``, the default): when the journal's run already existed (a restarted job attaching to
its run, a second ``fit``, a new rank 0 after an elastic reset, ``sync`` of an old journal), the run is read
once before anything is sent: a metric point at or below that metric's last logged step is not sent again
(counted and warned about once), a param equal to the logged one is not sent, and a param whose value changed
(MLflow refuses to change params) is warned about and logged as the tag ``param_changed.<name>``.

HTTP retries (408/429/5xx, connection errors, ``Retry-After``) are MLflow's own. An error the server will
repeat (4xx) is not retried forever: the entry is isolated, marked rejected in the journal, and warned about.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import batching
from ._log import logger
from .batching import EpochRecord
from .journal import REJECTED, Entry, Journal, JournalMeta
from .limits import Limits
from .redact import redact

JOURNAL_ID_TAG = "hvd_mlflow.journal_id"
DEFAULT_EXPERIMENT_ID = "0"
_READ_AHEAD = 2000


def http_status(error: BaseException) -> int | None:
    """The HTTP status behind ``error``: MLflow's exceptions, or the Azure SDK's (AzureML artifacts)."""
    from mlflow.exceptions import MlflowException

    if isinstance(error, MlflowException):
        return error.get_http_status_code()
    status = getattr(error, "status_code", None) or getattr(getattr(error, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def is_permanent(error: BaseException) -> bool:
    """Whether the server will give the same answer again (a 4xx other than 408 and 429)."""
    status = http_status(error)
    return status is not None and 400 <= status < 500 and status not in (408, 429)


class Uploader:
    """Delivers one journal to one tracking server through an ``MlflowClient``."""

    def __init__(
        self, journal: Journal, client: Any, limits: Limits, should_stop: Callable[[], bool] = lambda: False
    ) -> None:
        self.journal = journal
        self.client = client
        self.limits = limits
        self._should_stop = should_stop  # checked between requests: a stopped sender sends nothing more
        self.meta: JournalMeta = journal.meta()
        # a metrics request whose attempt failed: (its journal seqs, its last point); outcome unknown
        self._unsure: tuple[list[int], tuple[str, float, int, int]] | None = None
        self._isolate = False  # after a permanent error: one entry per request, to find the bad one
        self._created_here = False
        self._existing: _ExistingRun | None = None  # what the run holds: read when attached, then kept up
        self.skipped_points = 0

    @property
    def run_id(self) -> str | None:
        return self.meta.run_id

    # -- the run ---------------------------------------------------------------------------------------
    def ensure_run(self) -> str:
        if self.run_id:
            return self.run_id
        if self.meta.job_mode:
            raise RuntimeError("no run id in an AzureML job: hvd-mlflow never creates the job's run")
        journal_id = self.meta.journal_id
        experiment_id = self._experiment_id()
        if self.meta.create_attempted:  # an earlier create may have been applied
            found = self.client.search_runs(
                [experiment_id], filter_string=f"tags.`{JOURNAL_ID_TAG}` = '{journal_id}'", max_results=1
            )
            if found:
                return self._remember_run(found[0].info.run_id)
        self.meta = self.journal.update_meta(create_attempted=True)
        tags = {**self.meta.run_tags, JOURNAL_ID_TAG: journal_id}
        run = self.client.create_run(experiment_id, tags=tags)
        self._created_here = True
        return self._remember_run(run.info.run_id)

    def _experiment_id(self) -> str:
        if self.meta.experiment_id:
            return str(self.meta.experiment_id)
        name = self.meta.experiment_name
        if not name:
            return DEFAULT_EXPERIMENT_ID
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.meta = self.journal.update_meta(experiment_id=experiment_id)
        return experiment_id

    def _remember_run(self, run_id: str) -> str:
        self.meta = self.journal.update_meta(run_id=run_id, created_run=True)
        return run_id

    def finish(self) -> bool:
        """Once everything is delivered: end the run if hvd-mlflow created it and the training's outcome is
        known. True when nothing is left to do (``ended``: the run was ended, or is to be left as it is)."""
        if self.journal.count():
            return False
        self.meta = self.journal.meta()
        if self.meta.ended:
            return True
        status = self.meta.final_status
        if not status:
            return False
        if self.meta.created_run and not self.meta.job_mode and self.run_id:
            _end_run(self.client, self.run_id, status)
        self.meta = self.journal.update_meta(ended=True)
        return True

    # -- entries ---------------------------------------------------------------------------------------
    def upload_some(self) -> int:
        """Send what is pending (up to a read-ahead window); return how many entries were settled.

        Raises what the client raised on a transient failure; nothing is lost, the entries stay pending.
        """
        run_id = self.ensure_run()
        settled = self._settle_unsure(run_id)
        if self._existing is None:
            self._existing = self._read_existing(run_id)
        entries = self.journal.pending(_READ_AHEAD)
        for kind, group in _groups(entries, self._isolate):
            if self._should_stop():
                return settled
            try:
                if kind == "metrics":
                    settled += self._send_metrics(run_id, group)
                elif kind == "artifact":
                    settled += self._send_artifacts(run_id, group)
                else:
                    settled += self._send_params_tags(run_id, group)
            except Exception as error:
                if not is_permanent(error):
                    raise
                if kind != "metrics" and len(group) == 1 and len(group[0].payload) > 1:
                    settled += self._send_params_tags_one_by_one(run_id, group[0])
                    continue
                if len(group) > 1:  # find the entry the server refuses: one per request from now on
                    self._isolate = True
                    return settled
                self.journal.acknowledge([group[0].seq], state=REJECTED)
                settled += 1
                logger.warning(
                    "hvd-mlflow: the tracking server refused %s at step %s (%s); it is kept in journal %s "
                    "as rejected and not sent again",
                    group[0].kind,
                    group[0].step,
                    redact(str(error))[:500],
                    self.journal.location,
                )
        if not entries:
            self._isolate = False
        return settled

    def _read_existing(self, run_id: str) -> _ExistingRun:
        """What the run holds already (nothing when this uploader just created it); policy ``log``: no skipping."""
        if self.meta.resume != "skip":
            return _ExistingRun({}, {}, skip=False)
        if self._created_here:
            return _ExistingRun({}, {})
        data = self.client.get_run(run_id).data
        last_steps = {m.key: m.step for m in getattr(data, "_metric_objs", [])}
        return _ExistingRun(last_steps, dict(data.params))

    def _send_params_tags(self, run_id: str, group: list[Entry]) -> int:
        from mlflow.entities import Param, RunTag

        params = [Param(k, str(v)) for e in group if e.kind == "params" for k, v in e.payload.items()]
        tags = [RunTag(k, str(v)) for e in group if e.kind == "tags" for k, v in e.payload.items()]
        params, tags = self._resumed_params(params, tags)
        if params or tags:
            self.client.log_batch(run_id, params=params, tags=tags)
        self.journal.acknowledge([e.seq for e in group])
        return len(group)

    def _send_artifacts(self, run_id: str, group: list[Entry]) -> int:
        """Small JSON files (params over the run's limit). AzureML cannot overwrite an artifact: a 409 after a
        resend means the first upload was applied."""
        for entry in group:
            try:
                self.client.log_dict(run_id, entry.payload["content"], entry.payload["path"])
            except Exception as error:
                if http_status(error) != 409:
                    raise
            self.journal.acknowledge([entry.seq])
        return len(group)

    def _send_params_tags_one_by_one(self, run_id: str, entry: Entry) -> int:
        """The server refused a params/tags entry: send each item alone, so one bad item (a param whose value
        changed, say) does not take the others with it."""
        from mlflow.entities import Param, RunTag

        for key, value in entry.payload.items():
            item = [Param(key, str(value))] if entry.kind == "params" else [RunTag(key, str(value))]
            try:
                self.client.log_batch(run_id, **{entry.kind: item})
            except Exception as error:
                if not is_permanent(error):
                    raise
                logger.warning(
                    "hvd-mlflow: the tracking server refused %s %r=%r (%s); the other %s were logged",
                    entry.kind[:-1],
                    key,
                    redact(str(value))[:100],
                    redact(str(error))[:300],
                    entry.kind,
                )
        self.journal.acknowledge([entry.seq])
        return 1

    def _resumed_params(self, params: list[Any], tags: list[Any]) -> tuple[list[Any], list[Any]]:
        """Params the run already holds: equal ones are dropped, changed ones become tags (with a warning)."""
        from mlflow.entities import RunTag

        logged = self._existing.params if self._existing else {}
        changed = [p for p in params if p.key in logged and logged[p.key] != p.value]
        if changed:
            logger.warning(
                "hvd-mlflow: the run already has different values for param(s) %s (MLflow cannot change a "
                "param); the new values are logged as tags param_changed.<name>",
                ", ".join(f"{p.key}: {logged[p.key][:50]!r} -> {p.value[:50]!r}" for p in changed),
            )
        kept = [p for p in params if p.key not in logged]
        return kept, [*tags, *(RunTag(f"param_changed.{p.key}", p.value) for p in changed)]

    def _not_logged_yet(self, records: list[EpochRecord]) -> list[EpochRecord]:
        """``records`` without the points at or below their metric's last step in the run (what the run held
        when attached, and what was sent since): an epoch repeated after a restart is logged once."""
        if self._existing is None or not self._existing.skip:
            return records
        last = dict(self._existing.last_steps)  # advanced record by record: a repeat within ``records`` too
        out = []
        for record in records:
            kept = {k: v for k, v in record.metrics.items() if k not in last or record.step > last[k]}
            last.update({k: record.step for k in kept})
            skipped = len(record.metrics) - len(kept)
            if skipped and not self.skipped_points:
                # after an elastic reset the new rank 0 replays recent epochs on purpose: no warning then
                (logger.info if self.meta.elastic else logger.warning)(
                    "hvd-mlflow: the run already holds %s at step %d (and maybe later steps): points at or below "
                    "a metric's last logged step are not sent again (resume='skip'). Pass fit(initial_epoch=...) "
                    "to continue a run, or set resume='log' to log them anyway.",
                    sorted(set(record.metrics) - set(kept))[:5],
                    record.step,
                )
            self.skipped_points += skipped
            out.append(EpochRecord(record.step, record.timestamp_ms, kept))
        return out

    def _send_metrics(self, run_id: str, group: list[Entry]) -> int:
        from mlflow.entities import Metric

        records = self._not_logged_yet([EpochRecord(e.step or 0, e.timestamp_ms or 0, e.payload) for e in group])
        done = 0
        for request in batching.metric_requests(
            records, self.limits.metrics_per_request, self.limits.values_per_key_per_request
        ):
            if self._should_stop():
                break
            seqs = [e.seq for e in group[done : done + request.completes]]
            if request.points:
                self._unsure = (seqs, request.points[-1])
                self.client.log_batch(run_id, metrics=[Metric(*p) for p in request.points])
                self._unsure = None
                if self._existing is not None:
                    self._existing.sent(request.points)
            self.journal.acknowledge(seqs)
            done += request.completes
        return done

    def _settle_unsure(self, run_id: str) -> int:
        """After a failed attempt, acknowledge its entries if the server holds its last point anyway.

        A request can be applied and its answer lost; resending it would store every point twice on a
        server that does not drop exact duplicates. Each request's points all go in one call, and requests
        are sent in step order, so the request was applied iff its last point is the latest of its metric.
        """
        if self._unsure is None:
            return 0
        seqs, (key, _value, timestamp, step) = self._unsure
        latest = {m.key: m for m in getattr(self.client.get_run(run_id).data, "_metric_objs", [])}
        point = latest.get(key)
        self._unsure = None
        if point is not None and point.step == step and point.timestamp == timestamp:
            logger.info("hvd-mlflow: a request whose answer was lost had been applied; not sending it again")
            self.journal.acknowledge(seqs)
            return len(seqs)
        return 0


@dataclasses.dataclass
class _ExistingRun:
    last_steps: dict[str, int]  # metric key -> its last step in the run
    params: dict[str, str]
    skip: bool = True  # resume="skip"

    def sent(self, points: list[tuple[str, float, int, int]]) -> None:
        for key, _value, _timestamp, step in points:
            self.last_steps[key] = max(step, self.last_steps.get(key, step))


def _end_run(client: Any, run_id: str, status: str) -> None:
    """``set_terminated`` without its side effects: it also GETs the run and prints the run's URL to stdout,
    credentials included when the tracking URI carries them, from our background thread."""
    from mlflow.entities import RunStatus

    end_time = int(time.time() * 1000)
    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    if store is None:
        client.set_terminated(run_id, status=status, end_time=end_time)
    else:
        store.update_run_info(run_id, RunStatus.from_string(status), end_time, None)


def _groups(entries: list[Entry], isolate: bool) -> Iterator[tuple[str, list[Entry]]]:
    """Consecutive entries of one kind ("metrics", or params and tags together), in journal order."""
    group: list[Entry] = []
    kind = ""
    size = 0
    for entry in entries:
        entry_kind = entry.kind if entry.kind in ("metrics", "artifact") else "params_tags"
        fits = entry_kind != "params_tags" or size + len(entry.payload) <= 100
        if group and (isolate or entry_kind != kind or not fits):
            yield kind, group
            group, size = [], 0
        group.append(entry)
        kind = entry_kind
        size += len(entry.payload) if entry_kind == "params_tags" else 0
    if group:
        yield kind, group
