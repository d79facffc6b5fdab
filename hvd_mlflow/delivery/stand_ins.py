"""What a guarded MLflow write returns on ranks other than 0 (:mod:`hvd_mlflow.delivery.mlflow_calls`): what MLflow's
signature promises, built here without a request, since those ranks send nothing.

A user's script runs the same lines on every rank, and uses what the calls return:
``exp = mlflow.set_experiment("x"); mlflow.start_run(experiment_id=exp.experiment_id)``,
``info = mlflow.tensorflow.log_model(...); client.set_tag(run_id, "uri", info.model_uri)``. So each write whose
result a script can use returns a real MLflow object (an ``Experiment``, a ``Run``, a ``ModelInfo`` with its
``LoggedModel``, a ``RegisteredModel``, a ``ModelVersion``) or the value MLflow returns (an experiment id, the
logged param's value).

An id in it is the real one where this process knows it, the one rank 0 gets too:

* a run: the one the user passed (``start_run(run_id=...)``); the job's run for ``start_run()`` when there is one
  (``MLFLOW_RUN_ID`` as ``autolog()`` found it, or ``AZUREML_RUN_ID`` in an AzureML job: rank 0 attaches to it);
* an experiment: the one the user passed; the job's (``MLFLOW_EXPERIMENT_ID``) for the job's run, for a new run
  when nothing else names one (MLflow's own order), and for ``set_experiment(name)`` when the environment names
  that experiment (``MLFLOW_EXPERIMENT_NAME``); the one ``set_experiment`` returned here, for the runs after it.

Everywhere else rank 0's answer comes from the server (a new run's id, a new experiment's, a name's, a new model's,
a new version's number), and this process says so with a value of its own kind (:func:`unknown`):
never ``"0"`` (the Default experiment), ``""`` or a made-up id of MLflow's form, which a script would go on to
read as real (``search_runs([exp.experiment_id])`` on the Default experiment) or fail on with an error that
names nothing. Each names hvd-mlflow and the rank, and has a ``:``, outside the pattern MLflow checks run and
experiment ids against, so nothing resolves it to something real. A read given one raises at once on that rank
(:func:`refusal`, from ``mlflow_calls``' guard of ``MlflowClient``'s reads): MLflow's own answer depends on its
version (3.17: ``Invalid experiment ID``; a 3.15 server: a 500, retried for minutes; 2.12: an empty list).

Writes that MLflow answers with ``None`` (``log_metric``, ``set_tag``, ``log_artifact``, ...) return ``None``.
"""

from __future__ import annotations

import inspect
import os
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ..common import compat, topology
from . import destination

_MARK = "hvd-mlflow:rank-"  # what every value of :func:`unknown` begins with
_state: dict[str, Any] = {"experiment_id": None, "experiment_name": None, "job_run_id": None}


def unknown(kind: str) -> str:
    """What this process says where only rank 0 can know, for this process's rank now; ``kind``: "experiment-id",
    "experiment-name", "run-id", "model-id" or "model-version" (``hvd-mlflow:rank-1:unknown-run-id``)."""
    return f"{_MARK}{topology.current().rank}:unknown-{kind}"


def found_in(values: Any) -> str | None:
    """The first of ``values`` (strings, and lists or tuples of them, at any depth) that holds one of the
    :func:`unknown` values (an id, or a URI or filter made of one), else ``None``."""
    if isinstance(values, str):
        return values if _MARK in values else None
    if isinstance(values, (list, tuple, set, frozenset)):
        return next((found for v in values if (found := found_in(v)) is not None), None)
    return None


def refusal(call: str, value: str) -> Exception:
    """The error a read given one of the :func:`unknown` values raises at once (MLflow's own answer depends on its
    version: an error, minutes of retries of a server's 500, or an empty result)."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(
        f"hvd-mlflow: {call}() was given {value!r}, which this rank ({topology.current().rank}) got from a guarded "
        "MLflow call in place of an id that only rank 0 has (the server makes it for rank 0's call). Read it on "
        "rank 0, or send the id from rank 0 to the others (hvd.broadcast_object).",
        error_code=INVALID_PARAMETER_VALUE,
    )


def job_run_id(captured: str | None, job_mode: bool, environ: Mapping[str, str] = os.environ) -> str | None:
    """The job's run: ``MLFLOW_RUN_ID`` as ``autolog()`` found it, else ``AZUREML_RUN_ID`` in an AzureML job."""
    return captured or (environ.get(destination.AZUREML_RUN_VARIABLE) or None if job_mode else None)


def reset(job_run: str | None = None) -> None:
    """Forget ``set_experiment``'s experiment; ``job_run``: the job's run (:func:`job_run_id`), if there is one."""
    _state.update(experiment_id=None, experiment_name=None, job_run_id=job_run)


def arguments(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, as ``original`` would bind them (``{}`` when they do not bind)."""
    try:
        bound = inspect.signature(original).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return dict(kwargs)
    return {k: v for k, v in bound.arguments.items() if k not in ("self", "cls")}


def _now_ms() -> int:
    return int(time.time() * 1000)


def experiment_id(given: Any = None) -> str:
    """The experiment of a new run: ``given``, else the one ``set_experiment`` set here, else the job's (the
    environment's), else ``unknown("experiment-id")`` (MLflow's default, which is the server's): MLflow's order."""
    from_environment, _ = destination.experiment_from_environment()
    return str(given or _state["experiment_id"] or from_environment or unknown("experiment-id"))


def experiment(call: Mapping[str, Any]) -> Any:
    """``mlflow.set_experiment``'s ``Experiment``: the id given, or the job's when the name given is the job's
    experiment's, else unknown; later stand-in runs are in it."""
    from mlflow.entities import Experiment, LifecycleStage

    id_from_environment, name_from_environment = destination.experiment_from_environment()
    given_id, name = call.get("experiment_id"), call.get("experiment_name")
    job_experiment = bool(id_from_environment and name_from_environment)
    if given_id:
        found_id = str(given_id)
        if not name and job_experiment and found_id == id_from_environment:
            name = name_from_environment
    elif name and job_experiment and name == name_from_environment:
        found_id = id_from_environment
    else:
        found_id = unknown("experiment-id")
    name = name or unknown("experiment-name")
    found = Experiment(found_id, name, "", LifecycleStage.ACTIVE, tags=[], creation_time=_now_ms(),
                       last_update_time=_now_ms())  # fmt: skip
    _state.update(experiment_id=found.experiment_id, experiment_name=name)
    return found


def started_run(call: Mapping[str, Any]) -> Any:
    """``mlflow.start_run``'s ``Run``: the run asked for, else the job's (rank 0 attaches to it), else a new run."""
    from_environment, _ = destination.experiment_from_environment()
    if call.get("run_id"):  # an existing run: its experiment is the server's, unless set_experiment said it
        return run(call["run_id"], _state["experiment_id"] or unknown("experiment-id"), call)
    if _state["job_run_id"]:
        in_experiment = from_environment or _state["experiment_id"] or unknown("experiment-id")
        return run(_state["job_run_id"], in_experiment, call)
    return run(unknown("run-id"), experiment_id(call.get("experiment_id")), call)


def run(run_id: str, in_experiment: str, call: Mapping[str, Any]) -> Any:
    """A ``Run``, RUNNING, with empty data."""
    from mlflow.entities import LifecycleStage, Run, RunData, RunInfo, RunStatus

    arguments = {
        "run_uuid": run_id,  # MLflow 2.x's required name of the run id
        "run_id": run_id,
        "experiment_id": in_experiment,
        "user_id": "",
        "status": RunStatus.to_string(RunStatus.RUNNING),
        "start_time": call.get("start_time") or _now_ms(),
        "end_time": None,
        "lifecycle_stage": LifecycleStage.ACTIVE,
        "run_name": call.get("run_name") or "",
    }
    info = RunInfo(**compat.accepted(RunInfo, arguments))
    return Run(info, RunData())


def logged_model(call: Mapping[str, Any]) -> Any:
    """``create_logged_model``'s ``LoggedModel`` (READY: it is never uploaded from here); a new model's id is the
    server's."""
    from mlflow.entities import LoggedModel

    now = _now_ms()
    return LoggedModel(
        experiment_id=experiment_id(call.get("experiment_id")),
        model_id=call.get("model_id") or unknown("model-id"),
        name=call.get("name") or "model",
        artifact_location="",
        creation_timestamp=now,
        last_updated_timestamp=now,
        model_type=call.get("model_type"),
        source_run_id=call.get("source_run_id"),
        tags=dict(call.get("tags") or {}),
        params={k: str(v) for k, v in (call.get("params") or {}).items()},
    )


def model_info(call: Mapping[str, Any], active: Any = None) -> Any:
    """Every flavour's ``log_model`` (``Model.log``): a ``ModelInfo`` as this MLflow returns it (MLflow 3: with its
    ``LoggedModel``; 2.x: a ``runs:/`` URI) for the model this rank would have logged (nothing is saved), in the
    run given, else in ``active`` (the stand-in run ``start_run`` returned here). Without either, MLflow 3 logs the
    model in no run and 2.x in the run it starts (:func:`started_run`)."""
    import mlflow
    from mlflow.models.model import ModelInfo

    name = call.get("name") or call.get("artifact_path") or "model"
    flavor = call.get("flavor")
    flavor_name = getattr(flavor, "FLAVOR_NAME", None) or getattr(flavor, "__name__", "model").rsplit(".", 1)[-1]
    the_run = active if active is not None and not call.get("run_id") else None
    in_run = call.get("run_id") or (the_run.info.run_id if the_run is not None else None)
    model = None
    if compat.mlflow3():
        in_experiment = the_run.info.experiment_id if the_run is not None else experiment_id()
        model = logged_model({"name": name, "model_id": call.get("model_id"), "model_type": call.get("model_type"),
                              "tags": call.get("tags"), "params": call.get("params"), "source_run_id": in_run,
                              "experiment_id": in_experiment})  # fmt: skip
    elif in_run is None:
        in_run = started_run({}).info.run_id
    arguments = {
        "artifact_path": name,
        "flavors": {flavor_name: {}},
        "model_uri": f"models:/{model.model_id}" if model is not None else f"runs:/{in_run}/{name}",
        "model_uuid": uuid.uuid4().hex,
        "run_id": in_run,
        "saved_input_example_info": None,
        "signature": call.get("signature"),
        "utc_time_created": str(time.strftime("%Y-%m-%d %H:%M:%S.000000", time.gmtime())),
        "mlflow_version": mlflow.__version__,
        "metadata": call.get("metadata"),
        "prompts": call.get("prompts"),
        "logged_model": model,
    }
    return ModelInfo(**compat.accepted(ModelInfo, arguments))


def registered_model(call: Mapping[str, Any]) -> Any:
    from mlflow.entities.model_registry import RegisteredModel

    return RegisteredModel(call.get("name") or "", creation_timestamp=_now_ms(), description=call.get("description"))


def model_version(call: Mapping[str, Any]) -> Any:
    """A ``ModelVersion``: the version given (an update), else a new one, whose number is the server's."""
    from mlflow.entities.model_registry import ModelVersion

    arguments = {"source": call.get("source"), "run_id": call.get("run_id"), "description": call.get("description"),
                 "model_id": call.get("model_id")}  # fmt: skip
    version = str(call.get("version") or unknown("model-version"))
    return ModelVersion(call.get("name") or "", version, _now_ms(), **compat.accepted(ModelVersion, arguments))


# MlflowClient write methods whose result MLflow promises to be something: what other ranks get instead.
CLIENT_RESULTS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "create_run": lambda call: run(unknown("run-id"), experiment_id(call.get("experiment_id")), call),  # new
    "create_experiment": lambda call: unknown("experiment-id"),  # the new experiment's id is the server's
    "log_param": lambda call: call.get("value"),  # the value it logged
    "create_logged_model": logged_model,
    "finalize_logged_model": lambda call: logged_model({"model_id": call.get("model_id")}),
    "create_registered_model": registered_model,
    "rename_registered_model": lambda call: registered_model({"name": call.get("new_name")}),
    "update_registered_model": registered_model,
    "create_model_version": model_version,
    "_create_model_version": model_version,
    "copy_model_version": lambda call: model_version({"name": call.get("dst_name")}),
    "update_model_version": model_version,
    "transition_model_version_stage": model_version,
    "delete_traces": lambda call: 0,
}
FLUENT_RESULTS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "set_experiment": experiment,
    "log_param": lambda call: call.get("value"),
}
