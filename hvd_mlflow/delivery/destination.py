"""Where rank 0 logs: the tracking URI, the run to log into, and whether this is an AzureML job.

:func:`resolve` runs in the training thread and makes no request; opening the run (creating one when there
is none to attach to) is the sender's job, in its background thread (:mod:`hvd_mlflow.delivery.uploader`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from urllib.parse import urlsplit

from ..common.redact import mask_uri

RUN_ID_VARIABLE = "MLFLOW_RUN_ID"  # MLflow's start_run() deletes it when it attaches to the run
TRACKING_URI_VARIABLE = "MLFLOW_TRACKING_URI"
AZUREML_RUN_VARIABLE = "AZUREML_RUN_ID"  # set in every AzureML job: the job's run
EXPERIMENT_ID_VARIABLE, EXPERIMENT_NAME_VARIABLE = "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"


@dataclasses.dataclass(frozen=True)
class Destination:
    tracking_uri: str | None  # None: MLflow's default, which the sender resolves when it imports MLflow
    run_id: str | None
    experiment_id: str | None
    experiment_name: str | None
    job_mode: bool

    @property
    def display_uri(self) -> str:
        return mask_uri(self.tracking_uri) if self.tracking_uri else "MLflow's default tracking URI"


def run_id_from_environment(environ: Mapping[str, str] = os.environ) -> str | None:
    """The run the job asks for. Read it early: MLflow's ``start_run()`` deletes ``MLFLOW_RUN_ID``."""
    return environ.get(RUN_ID_VARIABLE) or None


def tracking_uri_from_environment(environ: Mapping[str, str] = os.environ) -> str | None:
    """The tracking URI the environment sets (``MLFLOW_TRACKING_URI``), without MLflow's default."""
    return environ.get(TRACKING_URI_VARIABLE) or None


def experiment_from_environment(environ: Mapping[str, str] = os.environ) -> tuple[str | None, str | None]:
    """The experiment the environment names: (``MLFLOW_EXPERIMENT_ID``, ``MLFLOW_EXPERIMENT_NAME``)."""
    return environ.get(EXPERIMENT_ID_VARIABLE) or None, environ.get(EXPERIMENT_NAME_VARIABLE) or None


def is_azureml(tracking_uri: str | None) -> bool:
    """Whether the tracking server is AzureML's (the ``azureml-mlflow`` plugin's URI scheme; never MLflow's default)."""
    return bool(tracking_uri) and urlsplit(tracking_uri).scheme == "azureml"


def is_azureml_job(tracking_uri: str | None, environ: Mapping[str, str] = os.environ) -> bool:
    return is_azureml(tracking_uri) and bool(environ.get(AZUREML_RUN_VARIABLE))


def resolve(captured_run_id: str | None, environ: Mapping[str, str] = os.environ) -> Destination:
    """The destination as the user configured it, without contacting any server.

    When the user's code has not imported MLflow, there is no active run, ``set_tracking_uri`` nor ``set_experiment``
    to ask MLflow about: the environment says it all (AzureML jobs, most launchers), or, where it names no tracking
    URI (the quickstart), the URI is MLflow's default (``tracking_uri`` None), which the sender resolves. Either way
    MLflow (a second or more to import) is imported by rank 0's sender, off the training thread: never at train
    begin, where every rank would wait for it."""
    active_run_id = active_experiment_id = None
    tracking_uri = tracking_uri_from_environment(environ)
    if "mlflow" in sys.modules:
        import mlflow
        from mlflow.tracking import fluent

        tracking_uri = mlflow.get_tracking_uri()
        active = mlflow.active_run()
        active_run_id = active.info.run_id if active is not None else None
        active_experiment_id = getattr(fluent, "_active_experiment_id", None)
    job_mode = is_azureml_job(tracking_uri, environ)
    run_id = captured_run_id or run_id_from_environment(environ) or active_run_id
    if run_id is None and job_mode:
        run_id = environ.get(AZUREML_RUN_VARIABLE)
    experiment_id, experiment_name = experiment_from_environment(environ)
    return Destination(
        tracking_uri=tracking_uri,
        run_id=run_id,
        experiment_id=active_experiment_id or experiment_id,
        experiment_name=experiment_name,
        job_mode=job_mode,
    )
