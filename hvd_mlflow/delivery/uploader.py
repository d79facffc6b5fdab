"""Upload a journal's pending entries into its MLflow run, idempotently, within the server's limits.

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
once before anything is sent (:mod:`hvd_mlflow.delivery.run_contents`): a metric point at or below that metric's last
logged step is not sent again (counted and warned about once), a param equal to the logged one is not sent, and
params whose value changed (MLflow refuses to change params) go, with one warning, to one JSON artifact.

Per-run limits (AzureML's): metric names within the name budget (:mod:`hvd_mlflow.delivery.metric_budget`), the values
of the others kept for one CSV artifact sent at the end; tags within the tag budget, the others in a JSON artifact.

HTTP retries (408/429/5xx, connection errors, ``Retry-After``) are MLflow's own. An error the server will
repeat (4xx) is not retried forever: a refused metrics request is split by key until the refused keys are found
(every other point goes through; a refused key is not sent again, with one warning quoting the server, and its
values join the CSV); another refused entry is isolated, marked rejected in the journal, and warned about.
"""

from __future__ import annotations

import csv
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from .._log import logger
from ..common.redact import redact
from . import batching
from .batching import EpochRecord
from .folder_artifacts import files
from .journal import DELIVERED, REJECTED, Entry, Journal, JournalMeta
from .limits import Limits
from .metric_budget import MetricBudget, is_epoch_name
from .run_contents import RunContents

JOURNAL_ID_TAG = "hvd_mlflow.journal_id"
DEFAULT_EXPERIMENT_ID = "0"
_READ_AHEAD = 2000
SENT_KINDS = ("params", "tags", "metrics", "artifact")  # what the uploader sends as it goes
NOT_ABOUT_CONTENT = (401, 403, 404)  # refusals of the request itself (auth, run), never split by key
# refusals of the credentials (401) or of the run (404): no entry is to blame, none is marked rejected; they stay
# pending (the sender backs off; sync fails saying why, for a sync with the right credentials or server)
NOT_ABOUT_ENTRIES = (401, 404)
Point = tuple[str, float, int, int]  # key, value, timestamp_ms, step
HELD = "over_budget"  # values kept for the over-budget CSV, sent once at the end
HELD_PAGE = 1000  # held entries read (and acknowledged) at a time to build that CSV


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
        self,
        journal: Journal,
        client: Any,
        limits: Limits,
        should_stop: Callable[[], bool] = lambda: False,
        user_metric_names: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        self.journal = journal
        self.client = client
        self.meta: JournalMeta = journal.meta()
        self.limits = limits.with_options(self.meta.max_metric_names, self.meta.max_rows_per_metric)
        self._should_stop = should_stop  # checked between requests: a stopped sender sends nothing more
        self._user_metric_names = user_metric_names  # what the user logs with mlflow.log_metric (rank 0)
        # a metrics call whose attempt failed: (the journal seqs it completes, or None for a part of a request;
        # its points); outcome unknown
        self._unsure: tuple[list[int] | None, list[Point]] | None = None
        self._delivered: set[Point] = set()  # points of entries not yet acknowledged that the server holds
        # journal entry -> its keys whose values are held for the CSV: kept until the entry is acknowledged (a
        # retry of a pending entry must not hold them twice), so it is bounded by the entries pending
        self._held: dict[int, set[str]] = {}
        self._artifacts: set[tuple[str, int]] = set()  # (kind, first entry) of the artifacts already journaled
        self._isolate = False  # after a permanent error: one entry per request, to find the bad one
        self.more_waiting = False  # the last upload_some left entries behind that were already pending
        self._created_here = False
        self._existing: RunContents | None = None  # what the run holds: read when attached, then kept up
        self._budget: MetricBudget | None = None
        self._refused: dict[str, str] = {}  # metric keys the server refused -> its message
        self._over_warned: set[str] = set()
        self._final = False  # nothing more will be journaled: settle what waits for the first epoch
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
        # the run's tags as the server holds them: those sent, and those it added (MLflow's mlflow.runName; AzureML's
        # own), which count against a per-run tag limit too
        self._existing = RunContents(skip=self.meta.resume == "skip", tag_keys=set(tags) | set(run.data.tags))
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
        """Once everything is delivered: send the over-budget CSV, end the run if hvd-mlflow created it and the
        training's outcome is known. True when nothing is left to do (``ended``: the run was ended, or is to be
        left as it is)."""
        self._final = True
        if self.journal.pending(1, kinds=SENT_KINDS):
            return False
        self.meta = self.journal.meta()
        if self.meta.ended and not self.journal.pending(1, kinds=(HELD,)):
            return True
        status = self.meta.final_status
        if not status and not self.meta.ended:
            return False
        run_id = self.ensure_run()
        self._send_held(run_id)  # also for a journal handed over at an elastic reset: its values are its own
        if self.meta.ended:
            return True
        if self.meta.created_run and not self.meta.job_mode:
            _end_run(self.client, run_id, status)
        self.meta = self.journal.update_meta(ended=True)
        return True

    # -- entries ---------------------------------------------------------------------------------------
    def upload_some(self) -> int:
        """Send what is pending (up to a read-ahead window); return how many entries were settled.
        ``more_waiting`` then tells whether entries pending before this call were left for the next one.

        Raises what the client raised on a transient failure; nothing is lost, the entries stay pending.
        """
        run_id = self.ensure_run()
        settled = self._settle_unsure(run_id)
        if self._existing is None:
            self._existing = self._read_existing(run_id)
        entries = self.journal.pending(_READ_AHEAD, kinds=SENT_KINDS)
        self.more_waiting = len(entries) >= _READ_AHEAD  # the window was full: the backlog goes on
        budget = self._metric_budget(entries)
        for kind, group in _groups(entries, self._isolate, self.limits.params_tags_per_request):
            if self._should_stop():
                return settled
            if kind == "metrics" and not budget.settled:
                continue  # the budget is settled at the first epoch end: batch values wait for it
            try:
                if kind == "metrics":
                    settled += self._send_metrics(run_id, group)
                elif kind == "artifact":
                    settled += self._send_artifacts(run_id, group)
                else:
                    settled += self._send_params_tags(run_id, group)
            except Exception as error:
                if not is_permanent(error) or http_status(error) in NOT_ABOUT_ENTRIES:
                    raise
                if kind == "params_tags" and len(group) == 1 and len(group[0].payload) > 1:
                    settled += self._send_params_tags_one_by_one(run_id, group[0])
                    continue
                if len(group) > 1:  # find the entry the server refuses: one per request from now on
                    self._isolate = True
                    self.more_waiting = True
                    return settled
                settled += self._reject(group[0], error)
        self._isolate = False  # the whole window went through (one by one, if it had to): the refused one is known
        return settled

    def deliver(self, until_done: bool, on_progress: Callable[[int], None] | None = None) -> int:
        """Upload until nothing that can be sent is pending (``until_done``: ``hvd-mlflow sync``, the end of
        ``fit``), or, while training, what was pending when it began: entries journaled meanwhile wait for the
        next call, so short epochs are packed. Either way a backlog longer than one read-ahead window, and the
        one-by-one search for the entry a server refuses, go on to the end within this call. The one "deliver"
        loop of the live sender and of ``sync``. Returns how many entries were settled; raises what the client
        raised on a transient failure (nothing is lost: the entries stay pending)."""
        settled, idle = 0, False
        while not self._should_stop():
            done = self.upload_some()
            settled += done
            if done and on_progress is not None:
                on_progress(done)
            if not self.more_waiting and not (until_done and done):
                return settled
            if not done and idle:  # nothing moved twice in a row: do not spin
                return settled
            idle = not done
        return settled

    def _reject(self, entry: Entry, error: BaseException, what: str = "") -> int:
        """The server refused ``entry`` for good: marked rejected in the journal with the reason (``sync`` reports
        it, and keeps the journal), warned about once, never sent again."""
        reason = " ".join(redact(str(error)).split())[:500]
        what = what or f"{entry.kind} {', '.join(sorted(entry.payload))[:200]}"
        if entry.step is not None:
            what += f" at step {entry.step}"
        self.journal.acknowledge([entry.seq], state=REJECTED, reason=f"{what}: {reason}")
        self._held.pop(entry.seq, None)
        logger.warning("hvd-mlflow: the tracking server refused %s (%s); it is kept in journal %s as rejected and "
                       "not sent again", what, reason, self.journal.location)  # fmt: skip
        return 1

    def _read_existing(self, run_id: str) -> RunContents:
        """What the run holds already: nothing to read when this uploader created it, nor with ``resume="log"``
        on a server without per-run limits."""
        skip = self.meta.resume == "skip"
        limited = self.limits.metric_names_per_run is not None or self.limits.tags_per_run is not None
        if self._created_here or not (skip or limited):
            return RunContents(skip=skip)
        return RunContents.read(self.client, run_id, skip)

    # -- the metric-name budget --------------------------------------------------------------------------
    def _metric_budget(self, entries: list[Entry]) -> MetricBudget:
        """The budget, settled at the first entry with epoch values (or at the end, when none will come)."""
        if self._budget is not None and self._budget.settled:
            return self._budget
        if self.limits.metric_names_per_run is None:  # no budget: nothing waits
            self._budget = MetricBudget(None)
            return self._budget
        metrics = [e for e in entries if e.kind == "metrics"]
        # settle at the first epoch values; or now when none can come before the others are sent: the training's
        # outcome is known (sync, the end of fit), or the read-ahead window is all batch values
        final = self._final or bool(self.journal.meta().final_status) or len(entries) >= _READ_AHEAD
        if final or any(is_epoch_name(k) for e in metrics for k in e.payload):
            existing = self._existing.metric_names if self._existing else set()
            self._budget = MetricBudget(self.limits.metric_names_per_run, existing, self._user_metric_names())
            self._budget.settle(k for e in metrics for k in e.payload)
            self._warn_over_budget()
        return self._budget or MetricBudget(0, settled=False)

    def _warn_over_budget(self) -> None:
        if self._budget is None:
            return
        new = [n for n in self._budget.over if n not in self._over_warned]
        if not new:
            return
        self._over_warned.update(new)
        logger.warning(
            "hvd-mlflow: this run keeps at most %d metric names (%s); %d are not logged as metrics: %s. Their values "
            "are kept in the artifact %s. Names are chosen in this order: Keras epoch metrics, their val_ twins, "
            "your own mlflow.log_metric names, hvd-mlflow's learning_rate/epoch_time_s/samples_per_s, rank_spread, "
            "batch/ curves; log fewer (rank_spread, log_every_n_steps) or set max_metric_names.",
            self._budget.limit,
            "AzureML's limit" if self.limits.metric_names_per_run == 50 else "max_metric_names",
            len(new),
            ", ".join(new[:12]) + (", ..." if len(new) > 12 else ""),
            self.held_artifact_path,
        )

    @property
    def held_artifact_path(self) -> str:
        return f"hvd_mlflow/metrics-over-budget-{self.meta.journal_id[:12]}.csv"

    def _hold(self, records: Iterable[EpochRecord]) -> None:
        """Keep values that are not sent as metrics (over the budget, refused) for the CSV artifact."""
        for record in records:
            if record.metrics:
                self.journal.append(HELD, record.metrics, step=record.step, timestamp_ms=record.timestamp_ms)

    def _send_held(self, run_id: str) -> None:
        """The over-budget CSV: every value that was not sent as a metric, once, at the end. The held entries are
        read a page at a time into a temporary SQLite file, which drops the repeats a retry may have held and sorts
        them by name and step, so memory stays bounded however many values were held."""
        if not self.journal.pending(1, kinds=(HELD,)):
            return
        self._warn_over_budget()
        with tempfile.TemporaryDirectory(prefix="hvd-mlflow-") as scratch:
            rows = sqlite3.connect(Path(scratch) / "held.sqlite", isolation_level=None)
            try:
                self._spill_held(rows)
                csv_path = Path(scratch) / PurePosixPath(self.held_artifact_path).name
                with csv_path.open("w", newline="") as out:
                    writer = csv.writer(out)
                    writer.writerow(["name", "step", "timestamp_ms", "value"])
                    writer.writerows(rows.execute("SELECT name, step, timestamp_ms, value FROM held ORDER BY name, "
                                                  "COALESCE(step, 0), COALESCE(timestamp_ms, 0), rowid"))  # fmt: skip
                state, reason = self._upload_held(run_id, csv_path)
                seqs = rows.execute("SELECT seq FROM seqs ORDER BY seq")
                while page := [seq for (seq,) in seqs.fetchmany(HELD_PAGE)]:
                    self.journal.acknowledge(page, state=state, reason=reason)
            finally:
                rows.close()

    def _spill_held(self, rows: sqlite3.Connection) -> None:
        rows.execute("CREATE TABLE held (name TEXT, step INTEGER, timestamp_ms INTEGER, value TEXT, "
                     "UNIQUE (name, step, timestamp_ms, value))")  # fmt: skip
        rows.execute("CREATE TABLE seqs (seq INTEGER PRIMARY KEY)")
        after = 0
        while page := self.journal.pending(HELD_PAGE, kinds=(HELD,), after=after):
            values = [(k, e.step, e.timestamp_ms, str(v)) for e in page for k, v in e.payload.items()]
            rows.execute("BEGIN")
            rows.executemany("INSERT OR IGNORE INTO held VALUES (?, ?, ?, ?)", values)
            rows.executemany("INSERT INTO seqs VALUES (?)", [(e.seq,) for e in page])
            rows.execute("COMMIT")
            after = page[-1].seq

    def _upload_held(self, run_id: str, csv_path: Path) -> tuple[int, str | None]:
        """Upload the CSV; the state its entries take (rejected, with the reason, when refused for good)."""
        try:
            self.client.log_artifact(run_id, str(csv_path), str(PurePosixPath(self.held_artifact_path).parent))
        except Exception as error:
            if http_status(error) == 409:  # AzureML cannot overwrite: a 409 after a resend means it was applied
                return DELIVERED, None
            if not is_permanent(error):
                raise
            message = " ".join(redact(str(error)).split())[:300]
            logger.warning("hvd-mlflow: the tracking server refused the artifact %s (%s); its values stay in journal "
                           "%s, marked rejected", self.held_artifact_path, message, self.journal.location)  # fmt: skip
            return REJECTED, f"the artifact {self.held_artifact_path}: {message}"
        return DELIVERED, None

    def _send_params_tags(self, run_id: str, group: list[Entry]) -> int:
        from mlflow.entities import Param, RunTag

        params = {k: str(v) for e in group if e.kind == "params" for k, v in e.payload.items()}
        tags = {k: str(v) for e in group if e.kind == "tags" for k, v in e.payload.items()}
        first = group[0].seq  # names the artifacts of this group, written once whatever the retries
        params = self._resumed_params(params, first)
        tags = self._within_tag_budget(tags, first)
        if params or tags:
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()],
                                  tags=[RunTag(k, v) for k, v in tags.items()])  # fmt: skip
            if self._existing is not None:
                self._existing.params.update(params)
                self._existing.tag_keys.update(tags)
        self.journal.acknowledge([e.seq for e in group])
        return len(group)

    def _within_tag_budget(self, tags: dict[str, str], first: int) -> dict[str, str]:
        """Tags that fit the run's tag limit (AzureML: 50, its own system tags included); the rest go to a JSON
        artifact, with one warning."""
        limit = self.limits.tags_per_run
        if limit is None or self._existing is None:
            return tags
        held = self._existing.tag_keys
        room = max(0, limit - len(held))
        kept, over = {}, {}
        for key, value in tags.items():
            if key in held or room > 0:
                room -= key not in held
                kept[key] = value
            else:
                over[key] = value
        if over and ("tags", first) not in self._artifacts:
            self._artifacts.add(("tags", first))
            path = f"hvd_mlflow/tags-{self.meta.journal_id[:12]}-{first}.json"
            logger.warning(
                "hvd-mlflow: this run keeps at most %d tags and holds %d; %d more (%s) are kept in the artifact %s",
                limit,
                len(held),
                len(over),
                ", ".join(list(over)[:5]),
                path,
            )
            self.journal.append("artifact", {"path": path, "content": over})
        return kept

    def _send_artifacts(self, run_id: str, group: list[Entry]) -> int:
        """Small JSON files (params over the run's limit), and local folders (TensorBoard's: ``folder``, sent file
        by file under ``path``). AzureML cannot overwrite an artifact: a 409 after a resend means the first upload
        was applied."""
        for entry in group:
            if "folder" in entry.payload:
                if not self._send_folder(run_id, entry):
                    continue
            else:
                _applied_once(lambda e=entry: self.client.log_dict(run_id, e.payload["content"], e.payload["path"]))
            self.journal.acknowledge([entry.seq])
        return len(group)

    def _send_folder(self, run_id: str, entry: Entry) -> bool:
        """Every file of a local folder into the run's artifacts; False (and the entry rejected) when it is gone."""
        folder = Path(entry.payload["folder"])
        if not folder.is_dir():
            gone = FileNotFoundError(f"{folder} no longer exists")
            self._reject(entry, gone, f"the folder for the artifacts {entry.payload['path']}")
            return False
        for path, sub in files(folder, bool(entry.payload.get("profile"))):
            target = "/".join(p for p in (entry.payload["path"], sub) if p)
            _applied_once(lambda p=path, t=target: self.client.log_artifact(run_id, str(p), t))
        return True

    def _send_params_tags_one_by_one(self, run_id: str, entry: Entry) -> int:
        """The server refused a params/tags entry: send each item alone, so one bad item (a param whose value
        changed, say) does not take the others with it."""
        from mlflow.entities import Param, RunTag

        refused: list[tuple[str, BaseException]] = []
        for key, value in entry.payload.items():
            item = [Param(key, str(value))] if entry.kind == "params" else [RunTag(key, str(value))]
            try:
                self.client.log_batch(run_id, **{entry.kind: item})
            except Exception as error:
                if not is_permanent(error):
                    raise
                refused.append((key, error))
        if not refused:
            self.journal.acknowledge([entry.seq])
            return 1
        keys = ", ".join(key for key, _ in refused)
        what = f"{entry.kind[:-1]} {keys} (the other {len(entry.payload) - len(refused)} {entry.kind} were logged)"
        return self._reject(entry, refused[0][1], what)

    def _resumed_params(self, params: dict[str, str], first: int) -> dict[str, str]:
        """Params the run already holds: equal ones are dropped; changed ones (MLflow cannot change a param) go to
        one JSON artifact with a warning, never one tag each (AzureML keeps 50 tags per run)."""
        if self._existing is None:
            return params
        changed = self._existing.changed_params(params)
        if changed and ("param-changes", first) not in self._artifacts:
            self._artifacts.add(("param-changes", first))
            path = f"hvd_mlflow/param-changes-{self.meta.journal_id[:12]}-{first}.json"
            logger.warning(
                "hvd-mlflow: the run already has different values for %d param(s) (%s; MLflow cannot change a "
                "param); the new values are in the artifact %s",
                len(changed),
                ", ".join(f"{k}: {c['logged'][:40]!r} -> {c['now'][:40]!r}" for k, c in list(changed.items())[:5]),
                path,
            )
            self.journal.append("artifact", {"path": path, "content": changed})
        return {k: v for k, v in params.items() if k not in self._existing.params}

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
        records = self._not_logged_yet([EpochRecord(e.step or 0, e.timestamp_ms or 0, e.payload) for e in group])
        records = self._split_by_budget(records, [e.seq for e in group])
        done = 0
        for request in batching.metric_requests(
            records, self.limits.metrics_per_request, self.limits.values_per_key_per_request
        ):
            if self._should_stop():
                break
            seqs = [e.seq for e in group[done : done + request.completes]]
            points = [p for p in request.points if p not in self._delivered]  # a retry skips what went through
            if points:
                self._log_points(run_id, points, seqs if len(points) == len(request.points) else None)
            self._acknowledge_metrics(seqs)
            self._delivered.difference_update(request.points)
            done += request.completes
        return done

    def _split_by_budget(self, records: list[EpochRecord], seqs: list[int]) -> list[EpochRecord]:
        """Each record's values without those not sent as metrics (over the budget, refused keys), which are held
        for the CSV, once per journal entry and key."""
        assert self._budget is not None
        sent, held = [], []
        for record, seq in zip(records, seqs, strict=True):
            ok = {k: v for k, v in record.metrics.items() if k not in self._refused and self._budget.admits(k)}
            sent.append(EpochRecord(record.step, record.timestamp_ms, ok))
            done = self._held.get(seq, set())
            rest = {k: v for k, v in record.metrics.items() if k not in ok and k not in done}
            if rest:
                self._held[seq] = done | set(rest)
            held.append(EpochRecord(record.step, record.timestamp_ms, rest))
        self._hold(held)
        self._warn_over_budget()
        return sent

    def _log_points(self, run_id: str, points: list[Point], seqs: list[int] | None) -> None:
        """One ``log_batch``; refused with a 4xx about its content, it is split by key until the refused keys are
        found: every other point goes through, a refused key's values are held for the CSV and the key is not
        sent again. What went through is remembered, so that a transient failure later in the split resends only
        the rest. ``seqs``: the journal entries this call completes (when it is their whole request)."""
        from mlflow.entities import Metric

        self._unsure = (seqs, points)
        try:
            self.client.log_batch(run_id, metrics=[Metric(*p) for p in points])
        except Exception as error:
            if not is_permanent(error) or http_status(error) in NOT_ABOUT_CONTENT:
                raise
            self._unsure = None
            keys = sorted({p[0] for p in points})
            if len(keys) == 1:
                self._refuse(keys[0], error, points)
                return
            half = set(keys[: len(keys) // 2])
            self._log_points(run_id, [p for p in points if p[0] in half], None)
            self._log_points(run_id, [p for p in points if p[0] not in half], None)
            return
        self._unsure = None
        self._delivered.update(points)
        if self._existing is not None:
            self._existing.sent(points)

    def _refuse(self, key: str, error: BaseException, points: list[Point]) -> None:
        message = redact(str(error))[:300]
        self._refused[key] = message
        logger.warning(
            "hvd-mlflow: the tracking server refused metric %r (%s); it is not sent again, and its values are kept "
            "in the artifact %s",
            key,
            message,
            self.held_artifact_path,
        )
        self._hold(EpochRecord(step, timestamp, {key: value}) for _key, value, timestamp, step in points)

    def _settle_unsure(self, run_id: str) -> int:
        """After a failed attempt, see whether the server holds its points anyway.

        A request can be applied and its answer lost; resending it would store every point twice on a
        server that does not drop exact duplicates. Each call's points all go in one request, and requests
        are sent in step order, so the call was applied iff its last point is the latest of its metric. A call
        that was a whole request acknowledges its entries; a part of a split request is remembered as delivered.
        """
        if self._unsure is None:
            return 0
        seqs, points = self._unsure
        key, _value, timestamp, step = points[-1]
        latest = {m.key: m for m in getattr(self.client.get_run(run_id).data, "_metric_objs", [])}
        point = latest.get(key)
        self._unsure = None
        if point is None or point.step != step or point.timestamp != timestamp:
            return 0
        logger.info("hvd-mlflow: a request whose answer was lost had been applied; not sending it again")
        if self._existing is not None:
            self._existing.sent(points)
        if seqs is None:
            self._delivered.update(points)
            return 0
        self._acknowledge_metrics(seqs)
        return len(seqs)

    def _acknowledge_metrics(self, seqs: list[int]) -> None:
        self.journal.acknowledge(seqs)
        for seq in seqs:
            self._held.pop(seq, None)


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


def _groups(entries: list[Entry], isolate: bool, params_tags_per_request: int) -> Iterator[tuple[str, list[Entry]]]:
    """Consecutive entries of one kind ("metrics", "artifact", or params and tags together), in journal order."""
    group: list[Entry] = []
    kind = ""
    size = 0
    for entry in entries:
        entry_kind = entry.kind if entry.kind in ("metrics", "artifact") else "params_tags"
        fits = entry_kind != "params_tags" or size + len(entry.payload) <= params_tags_per_request
        if group and (isolate or entry_kind != kind or not fits):
            yield kind, group
            group, size = [], 0
        group.append(entry)
        kind = entry_kind
        size += len(entry.payload) if entry_kind == "params_tags" else 0
    if group:
        yield kind, group


def _applied_once(upload: Callable[[], Any]) -> None:
    """``upload()``; a 409 (AzureML: the artifact exists, from an earlier try whose answer was lost) is success."""
    try:
        upload()
    except Exception as error:
        if http_status(error) != 409:
            raise
