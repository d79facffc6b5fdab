"""Rank 0's side of one ``fit``: journal every entry, let the sender upload it.

Params and tags are cut to the server's limits with a warning; metric names are already clean (see
:mod:`hvd_mlflow.every_rank.names`) when they get here. Params whose names collide once cleaned are not an error here
(rank 0 alone sees them, and raising would stop rank 0 alone): they are kept, with their own names, in the params
artifact, with a warning.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .._log import logger, warn_once
from ..common.redact import mask_uri, redact
from ..delivery import batching, limits
from ..delivery.destination import Destination
from ..delivery.journal import JournalMeta, LiveJournal
from ..delivery.sender import Sender
from ..every_rank.names import NameMap


class RunLogger:
    """Journal and sender for one training, created on rank 0 at train begin.

    Example::

        run_logger = RunLogger(destination.resolve(None), journal_dir=Path(".hvd_mlflow/journal"))
        run_logger.sender.start()
        run_logger.log_params({"epochs": "10"})
        run_logger.log_metrics_many([(0, int(time.time() * 1000), {"loss": 0.7})])
        run_logger.sender.close("FINISHED", deadline=time.monotonic() + 60)
    """

    def __init__(
        self,
        dest: Destination,
        journal_dir: Path,
        run_tags: Mapping[str, str] | None = None,
        resume: str = "skip",
        owns_run: bool = False,
        elastic: bool = False,
        max_metric_names: int | None = None,
        max_rows_per_metric: int | None = None,
    ):
        self.limits = limits.for_tracking_uri(dest.tracking_uri).with_options(max_metric_names, max_rows_per_metric)
        self._param_names = NameMap(self.limits.name_length, what="param", raise_on_collision=False)
        self._tag_names = NameMap(self.limits.tag_key_length, what="tag", raise_on_collision=False)
        meta = JournalMeta.new(
            tracking_uri=mask_uri(dest.tracking_uri) if dest.tracking_uri else "",  # "": MLflow's default (sender's)
            tracking_uri_has_credentials=bool(dest.tracking_uri) and mask_uri(dest.tracking_uri) != dest.tracking_uri,
            run_id=dest.run_id,
            experiment_id=dest.experiment_id,
            experiment_name=dest.experiment_name,
            job_mode=dest.job_mode,
            resume=resume,
            elastic=elastic,
            created_run=bool(owns_run and dest.run_id),  # a run hvd-mlflow created in another process (elastic)
            max_metric_names=max_metric_names,
            max_rows_per_metric=max_rows_per_metric,
        )
        self.journal = LiveJournal.open_new(journal_dir, meta)
        try:
            # MLflow's context tags (source, user, git commit) of a run the sender creates: it reads them itself,
            # off the training thread (MLflow's context registry is imported with MLflow, and runs git)
            self.sender = Sender(self.journal, dest.tracking_uri, self.limits,
                                 context_tags=_context_tags if dest.run_id is None else None)  # fmt: skip
            if run_tags:
                self.log_tags(run_tags)
        except BaseException:
            self.journal.release()  # its writer lock must not outlive this failure
            raise

    def log_params(self, params: Mapping[str, object]) -> None:
        """Log ``params``; over the server's params-per-run limit (AzureML: 200), and for names that collide once
        cleaned, the rest go to a JSON artifact ``hvd_mlflow/params-<journal id>.json`` with a warning."""
        clean, over = self._cleaned(params, self._param_names, "param", self.limits.param_value_length)
        if over:
            warn_once(
                "param-collision:" + ",".join(sorted(over)),
                "hvd-mlflow: param names %s become the same name once cleaned for MLflow/AzureML; they are logged "
                "with their own names in the artifact %s instead. Rename them to log them as params.",
                ", ".join(map(repr, sorted(over))),
                self._params_artifact(),
            )
        items = list(clean.items())
        limit = self.limits.params_per_run
        if limit is not None and len(items) > limit:
            items, beyond = items[:limit], dict(items[limit:])
            logger.warning(
                "hvd-mlflow: this server keeps at most %d params per run; %d more (%s, ...) are logged in the "
                "artifact %s instead",
                limit,
                len(beyond),
                ", ".join(list(beyond)[:3]),
                self._params_artifact(),
            )
            over.update(beyond)
        if over:
            self.journal.append("artifact", {"path": self._params_artifact(), "content": over}, durable=False)
        for part in batching.chunks(items, self.limits.params_tags_per_request):
            self.journal.append("params", dict(part), durable=False)  # synced by the epoch's commit
        self.sender.notify()

    def _params_artifact(self) -> str:
        return f"hvd_mlflow/params-{self.journal.meta().journal_id[:12]}.json"

    def log_tags(self, tags: Mapping[str, str]) -> None:
        """Log ``tags``: keys cleaned and cut to the server's length (AzureML: 100), values cut (AzureML: 1,000);
        keys that collide once cleaned go to a JSON artifact (``hvd_mlflow/tags-<journal id>.json``)."""
        clean, collided = self._cleaned(tags, self._tag_names, "tag", self.limits.tag_value_length)
        if collided:
            path = f"hvd_mlflow/tags-{self.journal.meta().journal_id[:12]}.json"
            warn_once("tag-collision", "hvd-mlflow: tag keys %s become the same key once cleaned; they are kept "
                      "in the artifact %s", ", ".join(map(repr, sorted(collided))), path)  # fmt: skip
            self.journal.append("artifact", {"path": path, "content": collided}, durable=False)
        for part in batching.chunks(list(clean.items()), self.limits.params_tags_per_request):
            self.journal.append("tags", dict(part), durable=False)  # synced by the epoch's commit
        self.sender.notify()

    def _cleaned(self, values: Mapping[str, object], name_map: NameMap, what: str, limit: int) -> tuple[dict, dict]:
        """``values`` under their clean names, cut to ``limit``; and those whose names collide once cleaned."""
        names = name_map(values)
        clean = {names[k]: self._fit(f"{what} {k!r}", str(v), limit) for k, v in values.items() if k in names}
        return clean, {k: redact(str(v)) for k, v in values.items() if k not in names}  # an artifact: never a secret

    def log_folder(self, folder: str, path: str, profile: bool, files: list[str] | None = None) -> None:
        """Upload a local folder's files (TensorBoard's event files) under the artifact ``path``, journaled: what
        cannot be sent before the end is uploaded by ``hvd-mlflow sync`` (the folder must still be there). ``files``:
        only these (paths relative to ``folder``), else every file in it."""
        payload: dict[str, Any] = {"path": path, "folder": folder, "profile": profile}
        if files is not None:
            payload["files"] = files
        self.journal.append("artifact", payload)
        self.sender.notify()

    def log_metrics_many(self, points: Iterable[tuple[int, int, Mapping[str, float]]], durable: bool = True) -> None:
        """Several ``(step, timestamp_ms, values)`` points in one journal transaction (one fsync when
        ``durable``; else synced by the next durable one)."""
        entries = [("metrics", values, step, timestamp_ms) for step, timestamp_ms, values in points]
        if entries:
            self.journal.append_many(entries, durable=durable)
            self.sender.notify()

    @staticmethod
    def _fit(what: str, value: str, limit: int) -> str:
        value = redact(value)
        if len(value) > limit:
            warn_once(
                f"truncate:{what}",
                "hvd-mlflow: %s is %d characters long; the tracking server accepts %d, so it is truncated",
                what,
                len(value),
                limit,
            )
            value = value[:limit]
        return value


def _context_tags() -> dict[str, Any]:
    """The tags MLflow's own ``start_run`` would add (source, user, git commit), for a run we create."""
    try:
        from mlflow.tracking.context import registry

        return {k: redact(str(v)) for k, v in registry.resolve_tags({}).items()}
    except Exception:  # noqa: BLE001 - context tags are a nicety
        return {}
