"""Rank 0's side of one ``fit``: journal every entry, let the sender upload it.

Params and tags are truncated to the server's limits with a warning; param and metric names are already
clean (see :mod:`hvd_mlflow.names`) when they get here.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from . import batching, limits
from ._log import logger, warn_once
from .destination import Destination
from .journal import Journal
from .names import NameMap
from .redact import mask_uri, redact
from .sender import Sender


class RunLogger:
    """Journal and sender for one training, created on rank 0 at train begin.

    Example::

        run_logger = RunLogger(destination.resolve(None), journal_dir=Path(".hvd_mlflow/journal"))
        run_logger.log_params({"epochs": "10"})
        run_logger.log_metrics(step=0, values={"loss": 0.7})
        run_logger.close("FINISHED", timeout=60)
    """

    def __init__(
        self,
        dest: Destination,
        journal_dir: Path,
        run_tags: Mapping[str, str] | None = None,
        resume: str = "skip",
        owns_run: bool = False,
        elastic: bool = False,
    ):
        self.limits = limits.for_tracking_uri(dest.tracking_uri)
        self._param_names = NameMap(self.limits.name_length, what="param")
        meta = {
            "tracking_uri": mask_uri(dest.tracking_uri),
            "tracking_uri_has_credentials": "1" if mask_uri(dest.tracking_uri) != dest.tracking_uri else "0",
            "run_id": dest.run_id,
            "experiment_id": dest.experiment_id,
            "experiment_name": dest.experiment_name,
            "job_mode": "1" if dest.job_mode else "0",
            "resume": resume,
            "elastic": "1" if elastic else "0",
            # a run hvd-mlflow created in another process (elastic): this one ends it
            **({"created_run": "1"} if owns_run and dest.run_id else {}),
            "run_tags": json.dumps(_context_tags()),
            "pid": str(os.getpid()),
            "host": socket.gethostname(),
        }
        try:
            self.journal = Journal.create(journal_dir, meta)
        except OSError as error:
            logger.warning(
                "hvd-mlflow: cannot write a journal in %s (%s); keeping it in memory, so what is not "
                "delivered when this process ends is lost. Set HVD_MLFLOW_JOURNAL_DIR to a writable folder.",
                journal_dir,
                error,
            )
            self.journal = Journal.in_memory(meta)
        self.sender = Sender(self.journal, dest.tracking_uri, self.limits)
        if run_tags:
            self.log_tags(run_tags)
        self.sender.start()

    def log_params(self, params: Mapping[str, object]) -> None:
        """Log ``params``; over the server's params-per-run limit (AzureML: 200), the rest go to a JSON artifact
        ``hvd_mlflow/params-<journal id>.json`` with a warning."""
        names = self._param_names(params)
        clean = {names[k]: self._fit(f"param {k!r}", str(v), self.limits.param_value_length) for k, v in params.items()}
        items = list(clean.items())
        limit = self.limits.params_per_run
        if limit is not None and len(items) > limit:
            items, over = items[:limit], dict(items[limit:])
            path = f"hvd_mlflow/params-{self.journal.meta()['journal_id'][:12]}.json"
            logger.warning(
                "hvd-mlflow: this server keeps at most %d params per run; %d more (%s, ...) are logged in the "
                "artifact %s instead",
                limit,
                len(over),
                ", ".join(list(over)[:3]),
                path,
            )
            self.journal.append("artifact", {"path": path, "content": over})
        for part in batching.chunks(items, self.limits.params_tags_per_request):
            self.journal.append("params", dict(part))
        self.sender.notify()

    def log_tags(self, tags: Mapping[str, str]) -> None:
        clean = {k: self._fit(f"tag {k!r}", str(v), self.limits.tag_value_length) for k, v in tags.items()}
        for part in batching.chunks(list(clean.items()), self.limits.params_tags_per_request):
            self.journal.append("tags", dict(part))
        self.sender.notify()

    def log_metrics(self, step: int, values: Mapping[str, float], timestamp_ms: int | None = None) -> None:
        when = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        self.journal.append("metrics", values, step=step, timestamp_ms=when)
        self.sender.notify()

    def wait_for_run(self, timeout: float) -> str | None:
        return self.sender.wait_for_run(timeout)

    def close(self, status: str | None, timeout: float) -> bool:
        return self.sender.close(status, timeout)

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


def _context_tags() -> dict[str, str]:
    """The tags MLflow's own ``start_run`` would add (source, user, git commit), for a run we create."""
    try:
        from mlflow.tracking.context import registry

        return {k: redact(str(v)) for k, v in registry.resolve_tags({}).items()}
    except Exception:  # noqa: BLE001 - context tags are a nicety
        return {}
