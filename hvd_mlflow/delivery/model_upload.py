"""A model saved on disk, uploaded into its run whole or not at all, before a deadline (rank 0's end of ``fit``).

A folder of files cannot be stored in one step: MLflow's stores take one file at a time (each stored whole or not at
all: :mod:`hvd_mlflow.delivery.bounded_artifacts`), and have no rename. So the upload is a transaction made of:

* **the entry file last.** Every file of the model goes up first, one at a time; the file a loader opens first goes
  last (``MLmodel`` of an MLflow model; ``saved_model.pb`` of a SavedModel, then ``model.keras``). A model whose
  entry file is there is whole: every other file was acknowledged before it was sent.
* **a deadline checked between files and bounding each request.** No file is started after ``stop``, and each
  request to the server's artifact proxy ends by ``stop`` (a timeout, no retry), so the thread that runs the upload
  has ended when ``fit`` returns.
* **undone when it cannot finish.** A file refused, or ``stop`` reached: every file sent (the one in flight too: the
  server may have stored it) is removed again, in the time kept between ``stop`` and ``deadline``. Under MLflow 3 the
  model is a logged model: it is created ``PENDING`` (files under its own location, not in the run's artifacts),
  made ``READY`` and linked to the run only once its files are all there, and deleted when the upload is undone.

What it cannot promise: AzureML's artifact service deletes nothing, so there a model cut short stays as the files
that arrived, without its entry file (not loadable: the warning says so and where the whole copy is); requests of
the AzureML plugin and of cloud stores keep their own timeouts, and MLflow's tracking calls (the run, the logged
model's creation and status) theirs; a request the client gave up on that the server only applies later (it held
the whole body and answers late) lands after the undo.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

from ..common.redact import redact
from . import bounded_artifacts, mlflow_calls

ARTIFACT_PATH = "model"
# what a loader opens first, in the order they go up: the SavedModel's graph, the native Keras file, the MLmodel
ENTRY_FILES = ("saved_model.pb", "model.keras", "MLmodel")


class Cancelled(Exception):
    """The caller stopped waiting: the upload ends at the next file."""


@dataclasses.dataclass
class Outcome:
    """What became of the upload: done, or why not and whether what was sent is gone again."""

    done: bool = False
    why: str = ""
    left_behind: list[str] = dataclasses.field(default_factory=list)  # sent, and could not be removed


def upload_order(folder: Path) -> list[Path]:
    """The files of ``folder``: the model's entry files last (:data:`ENTRY_FILES`), the others first."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    rank = {name: i + 1 for i, name in enumerate(ENTRY_FILES)}  # the others: 0
    return sorted(files, key=lambda p: (rank.get(p.name, 0), p.relative_to(folder).as_posix()))


class ModelUpload:
    """One model's upload into one run (call :meth:`run` on a thread; read :attr:`outcome` once it ended).

    ``logged_model``: an MLflow model logged as MLflow 3's logged model; else the files go under ``model/`` in the
    run's artifacts (MLflow 2's MLflow model, recorded in the run's model history; AzureML's plain artifacts).
    """

    def __init__(self, folder: Path, run_id: str, logged_model: bool, mlflow_model: bool, stop: float, end: float):
        self.folder, self.run_id = folder, run_id
        self.logged_model, self.mlflow_model = logged_model, mlflow_model
        self.stop, self.end = stop, end
        self.outcome = Outcome()
        self._cancelled = threading.Event()
        self._sent: list[str] = []
        self._repo: object = None
        self._run_folder: str | None = None  # the run's model/ (not a logged model's own location)
        self._model_id: str | None = None

    def cancel(self) -> None:
        """The caller stops waiting: no further file or call starts; what was sent is removed if there is time."""
        self._cancelled.set()

    def run(self) -> None:
        try:
            with mlflow_calls.internal():
                self._upload()
            self.outcome.done = True
        except Exception as error:  # noqa: BLE001 - reported by the caller, with where the saved copy is
            self.outcome.why = _why(error)
            with mlflow_calls.internal():
                self._undo()

    def _upload(self) -> None:
        from mlflow import MlflowClient
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        client = MlflowClient()
        self._check()
        run = client.get_run(self.run_id)
        if self.logged_model:
            self._check()
            model = client.create_logged_model(run.info.experiment_id, name=ARTIFACT_PATH, source_run_id=self.run_id,
                                               params=dict(run.data.params) or None)  # fmt: skip
            self._model_id = model.model_id
            self._name_in_mlmodel(model.model_id, model.artifact_location)
            repo, artifact_dir = get_artifact_repository(model.artifact_location), None
        else:
            repo, artifact_dir = get_artifact_repository(run.info.artifact_uri), ARTIFACT_PATH
        self._repo, self._run_folder = repo, artifact_dir
        for local in upload_order(self.folder):
            self._check()
            relative = local.parent.relative_to(self.folder).as_posix()
            target = "/".join(p for p in (artifact_dir, relative if relative != "." else None) if p) or None
            self._sent.append("/".join(p for p in (target, local.name) if p))
            bounded_artifacts.put(repo, local, target, self.stop)
        self._check()
        if self.logged_model:
            from mlflow.entities import LoggedModelOutput

            client.finalize_logged_model(self._model_id, "READY")
            client.log_outputs(self.run_id, [LoggedModelOutput(self._model_id, step=0)])
        elif self.mlflow_model:
            from mlflow.models import Model

            client._record_logged_model(self.run_id, Model.load(str(self.folder / "MLmodel")))  # its model history

    def _check(self) -> None:
        if self._cancelled.is_set():
            raise Cancelled("the end of fit's wait for it was over")
        if time.monotonic() >= self.stop:
            raise bounded_artifacts.DeadlinePassed("its share of flush_timeout was over")

    def _name_in_mlmodel(self, model_id: str, location: str) -> None:
        """The saved copy's ``MLmodel`` names its logged model, as ``log_model`` writes it (files only)."""
        from mlflow.models import Model

        path = self.folder / "MLmodel"
        mlmodel = Model.load(str(path))
        mlmodel.model_id = mlmodel.model_uuid = model_id
        mlmodel.run_id, mlmodel.artifact_path = self.run_id, location
        mlmodel.save(str(path))

    def _undo(self) -> None:
        """Remove what was sent (the logged model first: it leaves the run's view at once). Where the store removes
        folders only (MLflow 2's server), the run's ``model/`` goes whole: an earlier fit's model there, which this
        upload began to overwrite, would be a mix of two models."""
        if self._model_id is not None:
            from mlflow import MlflowClient

            try:
                MlflowClient().delete_logged_model(self._model_id)
            except Exception as error:  # noqa: BLE001 - said in the outcome
                self.outcome.left_behind.append(f"logged model {self._model_id} ({_why(error)})")
        left: list[str] = []
        for path in reversed(self._sent):
            try:
                bounded_artifacts.delete(self._repo, path, self.end)
            except Exception as error:  # noqa: BLE001 - said in the outcome
                left.append(f"{path} ({_why(error)})")
        if left and self._run_folder is not None:
            try:
                bounded_artifacts.delete(self._repo, self._run_folder, self.end)
                left = []
            except Exception as error:  # noqa: BLE001 - said in the outcome
                left.append(f"{self._run_folder}/ ({_why(error)})")
        self.outcome.left_behind.extend(left)


def _why(error: BaseException) -> str:
    return redact(f"{type(error).__name__}: {error}")[:300]
