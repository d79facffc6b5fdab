"""Resuming a run that already existed (``resume="skip"``, the default): a restarted job attaching to its run, a
second ``fit``, a new rank 0 after an elastic reset, ``sync`` of an old journal.

What the run holds is read once before anything is sent (:mod:`hvd_mlflow.delivery.run_contents`): a metric point at
or below that metric's last logged step is not sent again (counted and warned about once), a param equal to the
logged one is not sent, and params whose value changed (MLflow refuses to change params) go, with one warning, to
one JSON artifact.

Used on rank 0's sender thread and by the command line (``hvd-mlflow sync``), never on the training thread.
"""

from __future__ import annotations

from .._log import logger
from .batching import EpochRecord
from .journal import Journal
from .run_lifecycle import RunLifecycle


class Resume:
    """What is not sent again into a run that holds it already."""

    def __init__(self, journal: Journal, run: RunLifecycle) -> None:
        self.journal = journal
        self.run = run
        self._journaled: set[int] = set()  # first entries of the groups whose param-changes artifact is journaled
        self.skipped_points = 0

    def not_logged_yet(self, records: list[EpochRecord]) -> list[EpochRecord]:
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

    def params(self, params: dict[str, str], first: int) -> dict[str, str]:
        """Params the run already holds: equal ones are dropped; changed ones (MLflow cannot change a param) go to
        one JSON artifact with a warning, never one tag each (AzureML keeps 50 tags per run)."""
        existing = self.run.contents
        if existing is None:
            return params
        changed = existing.changed_params(params)
        if changed and first not in self._journaled:
            self._journaled.add(first)
            path = f"hvd_mlflow/param-changes-{self.run.meta.journal_id[:12]}-{first}.json"
            logger.warning(
                "hvd-mlflow: the run already has different values for %d param(s) (%s; MLflow cannot change a "
                "param); the new values are in the artifact %s",
                len(changed),
                ", ".join(f"{k}: {c['logged'][:40]!r} -> {c['now'][:40]!r}" for k, c in list(changed.items())[:5]),
                path,
            )
            self.journal.append("artifact", {"path": path, "content": changed})
        return {k: v for k, v in params.items() if k not in existing.params}
