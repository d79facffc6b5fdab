"""The journal's MLflow run: found or created once, idempotently, what it already holds, and its end.

The run is the one recorded in the journal; else a run carrying the journal's id as a tag (found again after a
create whose answer was lost); else a new one, tagged with that id. It is ended (when hvd-mlflow created it and the
training's outcome is known) once everything else is delivered. ``set_terminated`` is not used for that: it prints
the run's URL, credentials included, from a background thread.

What the run holds (:class:`RunContents`) is read once when the uploader attaches to it, then kept up to date as it
sends: for resuming (``resume="skip"``: a point at or below its metric's last logged step is not sent again; a param
equal to the logged one is not sent, a changed one goes to a JSON artifact) and for the per-run budgets of AzureML
(the metric names and tags the run holds count against its 50 and 50).

Used on rank 0's sender thread and by the command line (``hvd-mlflow sync``), never on the training thread.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

from .journal import Journal, JournalMeta
from .limits import Limits

JOURNAL_ID_TAG = "hvd_mlflow.journal_id"
DEFAULT_EXPERIMENT_ID = "0"


@dataclasses.dataclass
class RunContents:
    last_steps: dict[str, int] = dataclasses.field(default_factory=dict)  # metric key -> its last step in the run
    params: dict[str, str] = dataclasses.field(default_factory=dict)
    tag_keys: set[str] = dataclasses.field(default_factory=set)
    skip: bool = True  # resume="skip": nothing at or below a metric's last step is sent again

    def sent(self, points: Iterable[tuple[str, float, int, int]]) -> None:
        for key, _value, _timestamp, step in points:
            self.last_steps[key] = max(step, self.last_steps.get(key, step))

    def changed_params(self, params: dict[str, str]) -> dict[str, dict[str, str]]:
        """Params whose value differs from the logged one (MLflow cannot change a param)."""
        return {k: {"logged": self.params[k], "now": v} for k, v in params.items() if k in self.params
                and self.params[k] != v}  # fmt: skip


class RunLifecycle:
    """The run one journal is delivered into, through an ``MlflowClient``; ``meta`` is the journal's, kept current."""

    def __init__(self, journal: Journal, client: Any) -> None:
        self.journal = journal
        self.client = client
        self.meta: JournalMeta = journal.meta()
        self.created_here = False
        self.contents: RunContents | None = None  # what the run holds: read when attached, then kept up

    @property
    def run_id(self) -> str | None:
        return self.meta.run_id

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
        self.created_here = True
        # the run's tags as the server holds them: those sent, and those it added (MLflow's mlflow.runName; AzureML's
        # own), which count against a per-run tag limit too
        self.contents = RunContents(skip=self.meta.resume == "skip", tag_keys=set(tags) | set(run.data.tags))
        return self._remember_run(run.info.run_id)

    def _experiment_id(self) -> str:
        if self.meta.experiment_id:
            return str(self.meta.experiment_id)
        name = self.meta.experiment_name
        if not name:
            return DEFAULT_EXPERIMENT_ID
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self._create_experiment(name)
        self.meta = self.journal.update_meta(experiment_id=experiment_id)
        return experiment_id

    def _create_experiment(self, name: str) -> str:
        """Create ``name``; when another job created it an instant earlier (a sweep's jobs starting together: the
        server answers RESOURCE_ALREADY_EXISTS), take that one."""
        from mlflow.exceptions import MlflowException

        try:
            return str(self.client.create_experiment(name))
        except MlflowException as error:
            raced = error.error_code == "RESOURCE_ALREADY_EXISTS"
            experiment = self.client.get_experiment_by_name(name) if raced else None
            if experiment is None:
                raise
            return str(experiment.experiment_id)

    def _remember_run(self, run_id: str) -> str:
        self.meta = self.journal.update_meta(run_id=run_id, created_run=True)
        return run_id

    def read_contents(self, run_id: str, limits: Limits) -> RunContents:
        """What the run holds already: nothing to read when this uploader created it, nor with ``resume="log"``
        on a server without per-run limits."""
        skip = self.meta.resume == "skip"
        limited = limits.metric_names_per_run is not None or limits.tags_per_run is not None
        if self.created_here or not (skip or limited):
            return RunContents(skip=skip)
        data = self.client.get_run(run_id).data  # one get_run: the run's metrics (their last steps), params, tag keys
        last_steps = {m.key: m.step for m in getattr(data, "_metric_objs", [])}
        return RunContents(last_steps, dict(data.params), set(data.tags), skip)

    def finish(self, held_waiting: Callable[[], bool], send_held: Callable[[str], None]) -> bool:
        """Once every entry sent as it goes is delivered: send the held values (``send_held``), end the run if
        hvd-mlflow created it and the training's outcome is known. True when nothing is left to do (``ended``: the
        run was ended, or is to be left as it is)."""
        self.meta = self.journal.meta()
        if self.meta.ended and not held_waiting():
            return True
        status = self.meta.final_status
        if not status and not self.meta.ended:
            return False
        run_id = self.ensure_run()
        send_held(run_id)  # also for a journal handed over at an elastic reset: its values are its own
        if self.meta.ended:
            return True
        if self.meta.created_run and not self.meta.job_mode:
            _end_run(self.client, run_id, status)
        self.meta = self.journal.update_meta(ended=True)
        return True


def _end_run(client: Any, run_id: str, status: str) -> None:
    """``set_terminated`` without its side effects: it also GETs the run and prints the run's URL to stdout,
    credentials included when the tracking URI carries them, from our background thread."""
    from mlflow.entities import RunStatus

    # every MlflowClient has it (the azureml-mlflow plugin's store too); the sender's wrapper passes it through
    client._tracking_client.store.update_run_info(run_id, RunStatus.from_string(status), int(time.time() * 1000), None)
