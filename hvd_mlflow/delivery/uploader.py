"""Upload a journal's pending entries into its MLflow run, idempotently, within the server's limits.

Used by rank 0's background sender while training runs and by ``hvd-mlflow sync`` afterwards. Every step can
be repeated without harm:

* the run: a create whose answer was lost is found again by the journal's id, a tag of the run
  (:mod:`.run_lifecycle`);
* params and tags: sending the same value twice is a no-op for MLflow;
* metrics: each point keeps the timestamp it was measured at, so a resend is the *same* point (MLflow's SQL
  store drops exact duplicates). Servers that would store it twice (AzureML accepts several values at one
  step) are covered by checking, after any failed request, whether it was applied before resending it.

HTTP retries (408/429/5xx, connection errors, ``Retry-After``) are MLflow's own. An error the server will
repeat (4xx) is not retried forever: the entry (or metric key, or param/tag) it is about is isolated and not sent
again; every other one goes through.

This module is the request loop: read-ahead windows, requests grouped by kind, one entry per request while the
refused one is looked for. Each other job is a collaborator the :class:`Uploader` holds:

* :mod:`.run_lifecycle`: finding or creating the run, what it already holds, and ending it; what a run that already
  existed holds is not sent again (``resume="skip"``: metric points here, params in :mod:`.params_tags`);
* :mod:`.metric_names`: the run's metric-name budget (AzureML's), refused keys, and the CSV artifact their values
  are held for, sent at the end;
* :mod:`.params_tags`: params and tags, within the run's tag budget (the others in a JSON artifact);
* :mod:`.isolation`: a refused request narrowed down to what is refused, an attempt whose answer was lost settled;
* :mod:`.server_answers`: what an error from the server means.

Used on rank 0's sender thread and by the command line (``hvd-mlflow sync``), never on the training thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .._log import logger
from . import batching
from .batching import EpochRecord
from .folder_artifacts import files
from .isolation import Isolation
from .journal import Entry, Journal
from .limits import Limits
from .metric_names import MetricNames
from .params_tags import ParamsTags
from .run_lifecycle import JOURNAL_ID_TAG, RunLifecycle
from .server_answers import NOT_ABOUT_ENTRIES, applied_once, http_status, is_permanent

__all__ = ["JOURNAL_ID_TAG", "SENT_KINDS", "Uploader"]

_READ_AHEAD = 2000
SENT_KINDS = ("params", "tags", "metrics", "artifact")  # what the uploader sends as it goes


class Uploader:
    """Delivers one journal to one tracking server through an ``MlflowClient``."""

    def __init__(
        self,
        journal: Journal,
        client: Any,
        limits: Limits,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.journal = journal
        self.client = client
        self.run = RunLifecycle(journal, client)
        self.limits = limits.with_options(self.run.meta.max_metric_names, self.run.meta.max_rows_per_metric)
        self._should_stop = should_stop  # checked between requests: a stopped sender sends nothing more
        self.names = MetricNames(journal, client, self.run, self.limits)
        self.isolation = Isolation(journal, client, self.run, self.names)
        self.params_tags = ParamsTags(journal, client, self.run, self.limits)
        self.skipped_points = 0  # points a resumed run held already (resume="skip"): not sent again
        self._isolate = False  # after a permanent error: one entry per request, to find the bad one
        self.more_waiting = False  # the last upload_some left entries behind that were already pending

    @property
    def run_id(self) -> str | None:
        return self.run.run_id

    def finish(self) -> bool:
        """Once everything is delivered: send the over-budget CSV, end the run if hvd-mlflow created it and the
        training's outcome is known. True when nothing is left to do (``ended``: the run was ended, or is to be
        left as it is)."""
        self.names.final = True
        if self.journal.pending(1, kinds=SENT_KINDS):
            return False
        return self.run.finish(self.names.held_waiting, self.names.send_held)

    # -- entries ---------------------------------------------------------------------------------------
    def upload_some(self) -> int:
        """Send what is pending (up to a read-ahead window); return how many entries were settled.
        ``more_waiting`` then tells whether entries pending before this call were left for the next one.

        Raises what the client raised on a transient failure; nothing is lost, the entries stay pending.
        """
        run_id = self.run.ensure_run()
        settled = self.isolation.settle_unsure(run_id)
        if self.run.contents is None:
            self.run.contents = self.run.read_contents(run_id, self.limits)
        entries = self.journal.pending(_READ_AHEAD, kinds=SENT_KINDS)
        self.more_waiting = len(entries) >= _READ_AHEAD  # the window was full: the backlog goes on
        budget = self.names.budget_for(entries, window_full=len(entries) >= _READ_AHEAD)
        send = {"metrics": self._send_metrics, "artifact": self._send_artifacts, "params_tags": self.params_tags.send}
        for kind, group in _groups(entries, self._isolate, self.limits.params_tags_per_request):
            if self._should_stop():
                return settled
            if kind == "metrics" and not budget.settled:
                continue  # the budget is settled at the first epoch end: batch values wait for it
            try:
                settled += send[kind](run_id, group)
            except Exception as error:
                if not is_permanent(error) or http_status(error) in NOT_ABOUT_ENTRIES:
                    raise
                if kind == "params_tags" and len(group) == 1 and len(group[0].payload) > 1:
                    settled += self.isolation.params_tags_one_by_one(run_id, group[0])
                    continue
                if len(group) > 1:  # find the entry the server refuses: one per request from now on
                    self._isolate = True
                    self.more_waiting = True
                    return settled
                settled += self.isolation.reject(group[0], error)
        self._isolate = False  # the whole window went through (one by one, if it had to): the refused one is known
        return settled

    def deliver(self, until_done: bool, on_progress: Callable[[int], None] | None = None) -> int:
        """Upload until nothing that can be sent is pending (``until_done``: ``hvd-mlflow sync``, the end of
        ``fit``), or, while training, what was pending when it began: entries journaled meanwhile wait for the
        next call, so short epochs are packed. Either way a backlog longer than one read-ahead window, and the
        one-by-one search for the entry a server refuses, go on to the end within this call. The one "deliver"
        loop of the live sender and of ``sync``. Returns how many entries were settled; raises what the client
        raised on a transient failure (nothing is lost: the entries stay pending). ``on_progress(n)``: ``n`` entries
        settled since the last call."""
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

    def _send_metrics(self, run_id: str, group: list[Entry]) -> int:
        records = self._not_logged_yet([EpochRecord(e.step or 0, e.timestamp_ms or 0, e.payload) for e in group])
        records = self.names.split(records, [e.seq for e in group])
        done = 0
        for request in batching.metric_requests(
            records, self.limits.metrics_per_request, self.limits.values_per_key_per_request
        ):
            if self._should_stop():
                break
            seqs = [e.seq for e in group[done : done + request.completes]]
            points = [p for p in request.points if p not in self.isolation.delivered]  # a retry skips what went through
            if points:
                self.isolation.log_points(run_id, points, seqs if len(points) == len(request.points) else None)
            self.isolation.acknowledge_metrics(seqs)
            self.isolation.delivered.difference_update(request.points)
            done += request.completes
        return done

    def _not_logged_yet(self, records: list[EpochRecord]) -> list[EpochRecord]:
        """``records`` without the points at or below their metric's last step in the run (what the run held
        when attached, and what was sent since): an epoch repeated after a restart is logged once."""
        existing = self.run.contents
        if existing is None or not existing.skip:
            return records
        last = dict(existing.last_steps)  # advanced record by record: a repeat within ``records`` too
        out = []
        for record in records:
            kept = {k: v for k, v in record.metrics.items() if k not in last or record.step > last[k]}
            last.update({k: record.step for k in kept})
            skipped = len(record.metrics) - len(kept)
            if skipped and not self.skipped_points:
                # after an elastic reset the new rank 0 replays recent epochs on purpose: no warning then
                (logger.info if self.run.meta.elastic else logger.warning)(
                    "hvd-mlflow: the run already holds %s at step %d (and maybe later steps): points at or below "
                    "a metric's last logged step are not sent again (resume='skip'). Pass fit(initial_epoch=...) "
                    "to continue a run, or set resume='log' to log them anyway.",
                    sorted(set(record.metrics) - set(kept))[:5],
                    record.step,
                )
            self.skipped_points += skipped
            out.append(EpochRecord(record.step, record.timestamp_ms, kept))
        return out

    def _send_artifacts(self, run_id: str, group: list[Entry]) -> int:
        """Small JSON files (params over the run's limit), and local folders (TensorBoard's: ``folder``, sent file
        by file under ``path``). AzureML cannot overwrite an artifact: a 409 after a resend means the first upload
        was applied."""
        for entry in group:
            if "folder" in entry.payload:
                if not self._send_folder(run_id, entry):
                    continue
            else:
                applied_once(lambda e=entry: self.client.log_dict(run_id, e.payload["content"], e.payload["path"]))
            self.journal.acknowledge([entry.seq])
        return len(group)

    def _send_folder(self, run_id: str, entry: Entry) -> bool:
        """Every file of a local folder into the run's artifacts; False (and the entry rejected) when it is gone."""
        folder = Path(entry.payload["folder"])
        if not folder.is_dir():
            gone = FileNotFoundError(f"{folder} no longer exists")
            self.isolation.reject(entry, gone, f"the folder for the artifacts {entry.payload['path']}")
            return False
        listed = entry.payload.get("files")  # the files that fit wrote (journals of older versions: every file)
        chosen = files(folder, bool(entry.payload.get("profile")), only=listed)
        if listed is not None and len(chosen) < len(listed):
            gone = len(listed) - len(chosen)
            logger.warning("hvd-mlflow: %d of the %d files for the artifacts %s are no longer in %s; the others are "
                           "uploaded", gone, len(listed), entry.payload["path"], folder)  # fmt: skip
        for path, sub in chosen:
            target = "/".join(p for p in (entry.payload["path"], sub) if p)
            applied_once(lambda p=path, t=target: self.client.log_artifact(run_id, str(p), t))
        return True


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
