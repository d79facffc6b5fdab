"""Params and tags into the run, within its tag budget: a group of params/tags entries goes in one ``log_batch``;
params the run holds already are handled by :mod:`hvd_mlflow.delivery.resuming`, and tags over the run's tag limit
(AzureML: 50, its own system tags included) go to one JSON artifact instead, with one warning.

Used on rank 0's sender thread and by the command line (``hvd-mlflow sync``), never on the training thread.
"""

from __future__ import annotations

from typing import Any

from .._log import logger
from .journal import Entry, Journal
from .limits import Limits
from .resuming import Resume
from .run_lifecycle import RunLifecycle


class ParamsTags:
    """Sends groups of params/tags entries; keeps the run's tag budget."""

    def __init__(self, journal: Journal, client: Any, run: RunLifecycle, limits: Limits, resume: Resume) -> None:
        self.journal = journal
        self.client = client
        self.run = run
        self.limits = limits
        self.resume = resume
        self._journaled: set[int] = set()  # first entries of the groups whose over-budget tags artifact is journaled

    def send(self, run_id: str, group: list[Entry]) -> int:
        from mlflow.entities import Param, RunTag

        params = {k: str(v) for e in group if e.kind == "params" for k, v in e.payload.items()}
        tags = {k: str(v) for e in group if e.kind == "tags" for k, v in e.payload.items()}
        first = group[0].seq  # names the artifacts of this group, written once whatever the retries
        params = self.resume.params(params, first)
        tags = self._within_tag_budget(tags, first)
        if params or tags:
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()],
                                  tags=[RunTag(k, v) for k, v in tags.items()])  # fmt: skip
            if self.run.contents is not None:
                self.run.contents.params.update(params)
                self.run.contents.tag_keys.update(tags)
        self.journal.acknowledge([e.seq for e in group])
        return len(group)

    def _within_tag_budget(self, tags: dict[str, str], first: int) -> dict[str, str]:
        """Tags that fit the run's tag limit (AzureML: 50, its own system tags included); the rest go to a JSON
        artifact, with one warning."""
        limit = self.limits.tags_per_run
        if limit is None or self.run.contents is None:
            return tags
        held = self.run.contents.tag_keys
        room = max(0, limit - len(held))
        kept, over = {}, {}
        for key, value in tags.items():
            if key in held or room > 0:
                room -= key not in held
                kept[key] = value
            else:
                over[key] = value
        if over and first not in self._journaled:
            self._journaled.add(first)
            path = f"hvd_mlflow/tags-{self.run.meta.journal_id[:12]}-{first}.json"
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
