"""Params and tags into the run, within its tag budget: a group of params/tags entries goes in one ``log_batch``.
A param the run holds already (resuming a run: a restarted job, a second ``fit``, ``sync`` of an old journal) is not
sent again when equal, and params whose value changed (MLflow refuses to change params) go, with one warning, to one
JSON artifact; tags over the run's tag limit (AzureML: 50, its own system tags included) go to one JSON artifact
instead, with one warning.

Used on rank 0's sender thread and by the command line (``hvd-mlflow sync``), never on the training thread.
"""

from __future__ import annotations

from typing import Any

from .._log import logger
from .journal import Entry, Journal
from .limits import Limits
from .run_lifecycle import RunLifecycle


class ParamsTags:
    """Sends groups of params/tags entries; keeps the run's tag budget."""

    def __init__(self, journal: Journal, client: Any, run: RunLifecycle, limits: Limits) -> None:
        self.journal = journal
        self.client = client
        self.run = run
        self.limits = limits
        self._journaled: set[str] = set()  # the JSON artifacts journaled (param changes, over-budget tags)

    def send(self, run_id: str, group: list[Entry]) -> int:
        from mlflow.entities import Param, RunTag

        params = {k: str(v) for e in group if e.kind == "params" for k, v in e.payload.items()}
        tags = {k: str(v) for e in group if e.kind == "tags" for k, v in e.payload.items()}
        first = group[0].seq  # names the artifacts of this group, written once whatever the retries
        params = self._new_params(params, first)
        tags = self._within_tag_budget(tags, first)
        if params or tags:
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()],
                                  tags=[RunTag(k, v) for k, v in tags.items()])  # fmt: skip
            if self.run.contents is not None:
                self.run.contents.params.update(params)
                self.run.contents.tag_keys.update(tags)
        self.journal.acknowledge([e.seq for e in group])
        return len(group)

    def _new_params(self, params: dict[str, str], first: int) -> dict[str, str]:
        """Params the run already holds: equal ones are dropped; changed ones (MLflow cannot change a param) go to
        one JSON artifact with a warning, never one tag each (AzureML keeps 50 tags per run)."""
        existing = self.run.contents
        if existing is None:
            return params
        changed = existing.changed_params(params)
        if changed:
            self._artifact_once(
                "param-changes",
                first,
                changed,
                "hvd-mlflow: the run already has different values for %d param(s) (%s; MLflow cannot change a "
                "param); the new values are in the artifact %s",
                len(changed),
                ", ".join(f"{k}: {c['logged'][:40]!r} -> {c['now'][:40]!r}" for k, c in list(changed.items())[:5]),
            )
        return {k: v for k, v in params.items() if k not in existing.params}

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
        if over:
            self._artifact_once(
                "tags",
                first,
                over,
                "hvd-mlflow: this run keeps at most %d tags and holds %d; %d more (%s) are kept in the artifact %s",
                limit,
                len(held),
                len(over),
                ", ".join(list(over)[:5]),
            )
        return kept

    def _artifact_once(self, name: str, first: int, content: dict[str, Any], warning: str, *args: Any) -> None:
        """``content`` journaled as the JSON artifact ``hvd_mlflow/<name>-<journal id>-<first>.json`` once (``first``:
        the group's first entry, whatever the retries), with one warning (``args``, then the artifact's path)."""
        path = f"hvd_mlflow/{name}-{self.run.meta.journal_id[:12]}-{first}.json"
        if path not in self._journaled:
            self._journaled.add(path)
            logger.warning(warning, *args, path)
            self.journal.append("artifact", {"path": path, "content": content})
