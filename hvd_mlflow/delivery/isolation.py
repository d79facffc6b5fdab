"""A refusal costs only what the server refuses, and a lost answer never doubles a point.

A metrics request refused with a 4xx about its content is split by key until the refused keys are found: every
other point goes through, a refused key is not sent again (its values join the over-budget CSV). A refused
params/tags entry is resent item by item. An entry refused on its own is marked rejected in the journal, with the
reason, and warned about once. A metrics request whose attempt failed is checked, before anything is resent, for
having been applied anyway (AzureML would store its points twice).

Used on rank 0's sender thread and by the command line (``hvd-mlflow sync``), never on the training thread.
"""

from __future__ import annotations

from typing import Any

from .._log import logger
from ..common.redact import redact
from .journal import REJECTED, Entry, Journal
from .metric_names import MetricNames, Point
from .run_lifecycle import RunLifecycle
from .server_answers import NOT_ABOUT_CONTENT, http_status, is_permanent


class Isolation:
    """Sends what may be refused, narrowing a refusal down; remembers what went through of a split request."""

    def __init__(self, journal: Journal, client: Any, run: RunLifecycle, names: MetricNames) -> None:
        self.journal = journal
        self.client = client
        self.run = run
        self.names = names
        # a metrics call whose attempt failed: (the journal seqs it completes, or None for a part of a request;
        # its points); outcome unknown
        self.unsure: tuple[list[int] | None, list[Point]] | None = None
        self.delivered: set[Point] = set()  # points of entries not yet acknowledged that the server holds

    def log_points(self, run_id: str, points: list[Point], seqs: list[int] | None) -> None:
        """One ``log_batch``; refused with a 4xx about its content, it is split by key until the refused keys are
        found: every other point goes through, a refused key's values are held for the CSV and the key is not
        sent again. What went through is remembered, so that a transient failure later in the split resends only
        the rest. ``seqs``: the journal entries this call completes (when it is their whole request)."""
        from mlflow.entities import Metric

        self.unsure = (seqs, points)
        try:
            self.client.log_batch(run_id, metrics=[Metric(*p) for p in points])
        except Exception as error:
            if not is_permanent(error) or http_status(error) in NOT_ABOUT_CONTENT:
                raise
            self.unsure = None
            keys = sorted({p[0] for p in points})
            if len(keys) == 1:
                self.names.refuse(keys[0], error, points)
                return
            half = set(keys[: len(keys) // 2])
            self.log_points(run_id, [p for p in points if p[0] in half], None)
            self.log_points(run_id, [p for p in points if p[0] not in half], None)
            return
        self.unsure = None
        self.delivered.update(points)
        if self.run.contents is not None:
            self.run.contents.sent(points)

    def settle_unsure(self, run_id: str) -> int:
        """After a failed attempt, see whether the server holds its points anyway.

        A request can be applied and its answer lost; resending it would store every point twice on a
        server that does not drop exact duplicates. Each call's points all go in one request, and requests
        are sent in step order, so the call was applied iff its last point is the latest of its metric. A call
        that was a whole request acknowledges its entries; a part of a split request is remembered as delivered.
        """
        if self.unsure is None:
            return 0
        seqs, points = self.unsure
        key, _value, timestamp, step = points[-1]
        latest = {m.key: m for m in getattr(self.client.get_run(run_id).data, "_metric_objs", [])}
        point = latest.get(key)
        self.unsure = None
        if point is None or point.step != step or point.timestamp != timestamp:
            return 0
        logger.info("hvd-mlflow: a request whose answer was lost had been applied; not sending it again")
        if self.run.contents is not None:
            self.run.contents.sent(points)
        if seqs is None:
            self.delivered.update(points)
            return 0
        self.acknowledge_metrics(seqs)
        return len(seqs)

    def acknowledge_metrics(self, seqs: list[int]) -> None:
        self.journal.acknowledge(seqs)
        self.names.forget(seqs)

    def reject(self, entry: Entry, error: BaseException, what: str = "") -> int:
        """The server refused ``entry`` for good: marked rejected in the journal with the reason (``sync`` reports
        it, and keeps the journal), warned about once, never sent again."""
        reason = " ".join(redact(str(error)).split())[:500]
        what = what or f"{entry.kind} {', '.join(sorted(entry.payload))[:200]}"
        if entry.step is not None:
            what += f" at step {entry.step}"
        self.journal.acknowledge([entry.seq], state=REJECTED, reason=f"{what}: {reason}")
        self.names.forget([entry.seq])
        logger.warning("hvd-mlflow: the tracking server refused %s (%s); it is kept in journal %s as rejected and "
                       "not sent again", what, reason, self.journal.location)  # fmt: skip
        return 1

    def params_tags_one_by_one(self, run_id: str, entry: Entry) -> int:
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
        return self.reject(entry, refused[0][1], what)
