"""What a guarded MLflow write returns on ranks other than 0 (:mod:`hvd_mlflow.delivery.mlflow_calls`): what MLflow's
signature promises, built here without a request, since those ranks send nothing.

A user's script runs the same lines on every rank, and uses what the calls return:
``exp = mlflow.set_experiment("x"); mlflow.start_run(experiment_id=exp.experiment_id)``,
``info = mlflow.tensorflow.log_model(...); client.set_tag(run_id, "uri", info.model_uri)``. So each write whose
result a script can use returns a real MLflow object (an ``Experiment``, a ``Run``, a ``ModelInfo`` with its
``LoggedModel``, a ``RegisteredModel``, a ``ModelVersion``) or the value MLflow returns (an experiment id, the
logged param's value), filled with what this process knows:

* an experiment: its name as given, and the id given, else the job's experiment id where the environment gives one
  (``MLFLOW_EXPERIMENT_ID``), else :data:`UNKNOWN_EXPERIMENT_ID` (the real id is known on rank 0 only);
  ``set_experiment`` remembers it for the runs started after it; ``create_experiment`` returns that id too;
* a run: the job's run id (``MLFLOW_RUN_ID`` when ``autolog()`` ran) or the one asked for, else ``""``;
* a model: a fresh ``m-<uuid>`` id (MLflow's own form), ``models:/<id>`` as its URI, the run it was logged in.

Writes that MLflow answers with ``None`` (``log_metric``, ``set_tag``, ``log_artifact``, ...) return ``None``.
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ..common import compat
from . import destination

UNKNOWN_EXPERIMENT_ID = "0"  # MLflow's default experiment: what a rank that cannot ask the server says
_state: dict[str, Any] = {"experiment_id": None, "experiment_name": None}


def reset() -> None:
    _state.update(experiment_id=None, experiment_name=None)


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
    """The experiment id this rank reports: ``given``, else the one ``set_experiment`` set here, else the job's (the
    environment's), else :data:`UNKNOWN_EXPERIMENT_ID`: MLflow's own order for a new run."""
    from_environment, _ = destination.experiment_from_environment()
    return str(given or _state["experiment_id"] or from_environment or UNKNOWN_EXPERIMENT_ID)


def experiment(call: Mapping[str, Any]) -> Any:
    """``mlflow.set_experiment``'s ``Experiment``: the name given, the id given or the job's (the environment's);
    later stand-in runs are in it."""
    from mlflow.entities import Experiment, LifecycleStage

    id_from_environment, name_from_environment = destination.experiment_from_environment()
    name = call.get("experiment_name") or name_from_environment or "Default"
    found_id = str(call.get("experiment_id") or id_from_environment or UNKNOWN_EXPERIMENT_ID)
    found = Experiment(found_id, name, "", LifecycleStage.ACTIVE, tags=[], creation_time=_now_ms(),
                       last_update_time=_now_ms())  # fmt: skip
    _state.update(experiment_id=found.experiment_id, experiment_name=name)
    return found


def created_experiment_id(call: Mapping[str, Any]) -> str:
    """``create_experiment``'s id (the new experiment exists on rank 0 only, its id is not known here)."""
    return UNKNOWN_EXPERIMENT_ID


def run(run_id: str | None, call: Mapping[str, Any] | None = None) -> Any:
    """A ``Run`` (``create_run``), RUNNING, with empty data."""
    from mlflow.entities import LifecycleStage, Run, RunData, RunInfo, RunStatus

    call = call or {}
    the_id = call.get("run_id") or run_id or ""
    arguments = {
        "run_uuid": the_id,  # MLflow 2.x's required name of the run id
        "run_id": the_id,
        "experiment_id": experiment_id(call.get("experiment_id")),
        "user_id": "",
        "status": RunStatus.to_string(RunStatus.RUNNING),
        "start_time": call.get("start_time") or _now_ms(),
        "end_time": None,
        "lifecycle_stage": LifecycleStage.ACTIVE,
        "run_name": call.get("run_name") or "",
    }
    info = RunInfo(**compat.accepted(RunInfo, arguments))
    return Run(info, RunData())


def param_value(call: Mapping[str, Any]) -> Any:
    """``log_param`` returns the value it logged."""
    return call.get("value")


def logged_model(call: Mapping[str, Any], run_id: str | None = None) -> Any:
    """``create_logged_model``'s ``LoggedModel`` (READY: it is never uploaded from here)."""
    from mlflow.entities import LoggedModel

    now = _now_ms()
    return LoggedModel(
        experiment_id=experiment_id(call.get("experiment_id")),
        model_id=call.get("model_id") or f"m-{uuid.uuid4().hex}",
        name=call.get("name") or "model",
        artifact_location="",
        creation_timestamp=now,
        last_updated_timestamp=now,
        model_type=call.get("model_type"),
        source_run_id=call.get("source_run_id") or run_id,
        tags=dict(call.get("tags") or {}),
        params={k: str(v) for k, v in (call.get("params") or {}).items()},
    )


def finalized_model(call: Mapping[str, Any]) -> Any:
    return logged_model({"model_id": call.get("model_id")})


def model_info(call: Mapping[str, Any], run_id: str | None) -> Any:
    """Every flavour's ``log_model`` (``Model.log``): a ``ModelInfo`` as this MLflow returns it (MLflow 3: with its
    ``LoggedModel``; 2.x: a ``runs:/`` URI) for the model this rank would have logged (nothing is saved)."""
    import mlflow
    from mlflow.models.model import ModelInfo

    name = call.get("name") or call.get("artifact_path") or "model"
    flavor = call.get("flavor")
    flavor_name = getattr(flavor, "FLAVOR_NAME", None) or getattr(flavor, "__name__", "model").rsplit(".", 1)[-1]
    in_run = call.get("run_id") or run_id or ""
    model = None
    if compat.mlflow3():
        model = logged_model({"name": name, "model_id": call.get("model_id"), "model_type": call.get("model_type"),
                              "tags": call.get("tags"), "params": call.get("params")}, run_id=in_run)  # fmt: skip
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
    from mlflow.entities.model_registry import ModelVersion

    arguments = {"source": call.get("source"), "run_id": call.get("run_id"), "description": call.get("description"),
                 "model_id": call.get("model_id")}  # fmt: skip
    return ModelVersion(call.get("name") or "", "1", _now_ms(), **compat.accepted(ModelVersion, arguments))


# MlflowClient write methods whose result MLflow promises to be something: what other ranks get instead.
CLIENT_RESULTS: dict[str, Callable[[Mapping[str, Any], str | None], Any]] = {
    "create_run": lambda call, run_id: run(run_id, call),
    "create_experiment": lambda call, run_id: created_experiment_id(call),
    "log_param": lambda call, run_id: param_value(call),
    "create_logged_model": lambda call, run_id: logged_model(call, run_id),
    "finalize_logged_model": lambda call, run_id: finalized_model(call),
    "create_registered_model": lambda call, run_id: registered_model(call),
    "rename_registered_model": lambda call, run_id: registered_model({"name": call.get("new_name")}),
    "update_registered_model": lambda call, run_id: registered_model(call),
    "create_model_version": lambda call, run_id: model_version(call),
    "copy_model_version": lambda call, run_id: model_version({"name": call.get("dst_name")}),
    "update_model_version": lambda call, run_id: model_version(call),
    "transition_model_version_stage": lambda call, run_id: model_version(call),
    "delete_traces": lambda call, run_id: 0,
}
FLUENT_RESULTS: dict[str, Callable[[Mapping[str, Any], str | None], Any]] = {
    "set_experiment": lambda call, run_id: experiment(call),
    "log_param": lambda call, run_id: param_value(call),
}
