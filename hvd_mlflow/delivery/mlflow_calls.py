"""Keep MLflow writes to one writer: rank 0.

In an AzureML job every rank inherits the job's run id, so any ``mlflow.log_*``, ``mlflow.start_run``,
``mlflow.autolog`` or ``mlflow.<flavour>.autolog`` in user code writes duplicate points into the job's run from
every rank (outside AzureML it creates one stray run per rank). :func:`install` makes every MLflow write path a
no-op on ranks other than 0, each with one warning that says why: the fluent functions (also when the user
imported them before ``autolog()``: they end in the client), every write method of ``MlflowClient``, and
``log_model`` of every flavour (through ``mlflow.models.Model.log``). Each returns there what MLflow's signature
promises, built without a request (:mod:`hvd_mlflow.delivery.stand_ins`): ``set_experiment`` an ``Experiment``,
``create_experiment`` an id, ``log_model`` a ``ModelInfo``, ``create_run`` a ``Run``, ...; so a script that uses
the results runs on every rank; their ids are the real ones where this process knows them, and values that say so
where only rank 0 can know them, which ``MlflowClient``'s reads refuse at once. ``mlflow.start_run()`` there
returns a run object (the job's run when there is one), which ``mlflow.active_run()`` then returns too, until
``mlflow.end_run()``. On rank 0 the user's own ``mlflow.log_*`` calls keep working.

MLflow's TensorFlow/Keras autologging is turned off on every rank while ``hvd_mlflow.autolog()`` is on: it
logs each rank's local values, per epoch and at every validation, so every Keras metric would be there twice
(``log_every_epoch=False`` does not stop its validation logging). hvd-mlflow logs the params itself. Its
modules import TensorFlow, so they are patched when the user imports them (MLflow's own post-import hooks).

In an AzureML job, MLflow's ``start_run()`` deletes ``MLFLOW_RUN_ID`` from the environment when it attaches to
the job's run, and ``end_run()`` deletes it again, so the next ``start_run()`` or ``mlflow.log_metric`` would
create a new run beside the job's. On rank 0 the variable is put back (the job's run: ``MLFLOW_RUN_ID`` as
``autolog()`` found it, else ``AZUREML_RUN_ID``) around each ``start_run`` and after each ``end_run``: in a job,
every ``start_run()`` is the job's run, on every rank.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .._log import warn_once
from ..common import topology
from . import destination, metric_budget, stand_ins

FLUENT_WRITERS = (
    "log_metric", "log_metrics", "log_param", "log_params", "set_tag", "set_tags", "delete_tag", "log_artifact",
    "log_artifacts", "log_dict", "log_text", "log_figure", "log_image", "log_table", "log_input", "log_inputs",
    "set_experiment",
)  # fmt: skip
AUTOLOG_FLAVOURS = ("mlflow.tensorflow", "mlflow.keras")
# MlflowClient methods that write (everything else reads): made no-ops on ranks other than 0.
CLIENT_WRITE_PREFIXES = (
    "log_", "set_", "create_", "delete_", "update_", "rename_", "restore_", "finalize_", "link_", "unlink_",
    "transition_", "register_", "detach_", "add_", "remove_", "copy_", "refresh_", "end_", "start_",
)  # fmt: skip
# MlflowClient methods that read: given a stand-in's unknown id (stand_ins.unknown), they raise at once.
CLIENT_READ_PREFIXES = ("get_", "search_", "list_", "download_", "load_")

_originals: list[tuple[object, str, Any]] = []
_state: dict[str, Any] = {"rank": None, "active": None}  # active: the stubbed run start_run() returned
_lock = threading.RLock()  # install (maybe from the thread importing MLflow) against uninstall (autolog(disable=True))


def _patch(owner: object, name: str, replacement: Callable[..., Any]) -> None:
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_hvd_mlflow_guard", False):
        return
    _originals.append((owner, name, original))
    functools.update_wrapper(replacement, original)
    replacement._hvd_mlflow_guard = True  # type: ignore[attr-defined]
    setattr(owner, name, replacement)


_local = threading.local()


@contextlib.contextmanager
def internal() -> Iterator[None]:
    """hvd-mlflow's own MLflow calls in this thread (rank 0's sender, its model upload) pass the guard: after an
    elastic reset a process that was rank 0 may still be finishing a request, and must not have it silenced
    while it believes it was sent."""
    _local.internal = True
    try:
        yield
    finally:
        _local.internal = False


def _writes_here() -> bool:
    """Whether this process writes now: rank 0, asked at each call (an elastic reset can make rank 1 rank 0), or
    hvd-mlflow's own sender."""
    return getattr(_local, "internal", False) or topology.current().rank == 0


def _warn(name: str) -> None:
    rank = topology.current().rank
    warn_once(
        f"guard:{name}",
        "hvd-mlflow: mlflow.%s() on rank %d does nothing: only rank 0 writes to MLflow (every rank shares the "
        "job's run, so other ranks would add duplicate points). Pass autolog(guard_other_ranks=False) to allow it.",
        name,
        rank,
    )


_user_metrics: dict[str, dict[str, None]] = {}  # run id -> the metric names the user logged into it on rank 0


def user_metric_names(run_id: str | None) -> list[str]:
    """The metric names user code logged through MLflow into run ``run_id`` in this process (rank 0), in order:
    that run's metric-name budget keeps their places before hvd-mlflow's own extras."""
    return list(_user_metrics.get(run_id or "", {}))


_METRIC_WRITES = ("MlflowClient.log_metric", "MlflowClient.log_batch")  # where every fluent metric write ends


def _within_run_budget(
    name: str, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], bool]:
    """The user's own metric write on rank 0: its metric names are noted by run (:func:`user_metric_names`; every
    fluent write ends in one of the client's two). Into a run hvd-mlflow logs into here with a name limit (AzureML:
    50), a name new to the run goes through only while a place is left (metric_budget.RunNames, shared with the
    sender's budget); the values of the others are not sent as metrics but kept in a CSV artifact, with one warning.
    Returns the call's arguments without them, and whether nothing is left to send. Never raises: bookkeeping that
    fails lets the call through as it was."""
    try:
        call = stand_ins.arguments(original, args, kwargs)
        with contextlib.suppress(Exception):  # noting names is a help to the budget, never a reason to warn
            keys = [call.get("key")] if name.endswith("log_metric") else [m.key for m in call.get("metrics") or ()]
            noted = _user_metrics.setdefault(str(call.get("run_id")), {})
            noted.update(dict.fromkeys(str(k) for k in keys if k is not None))
        names = metric_budget.known_run(str(call.get("run_id") or ""))
        if names is None or names.limit is None:
            return args, kwargs, False
        if name == "MlflowClient.log_metric":
            if names.admit(str(call["key"])):
                return args, kwargs, False
            from mlflow.entities import Metric

            step = call.get("step") or 0
            timestamp = call.get("timestamp") or int(time.time() * 1000)
            _hold(args[0], call, names, [Metric(str(call["key"]), float(call["value"]), int(timestamp), int(step))])
            return args, kwargs, True
        metrics = list(call.get("metrics") or ())
        kept = [m for m in metrics if names.admit(m.key)]
        if len(kept) == len(metrics):
            return args, kwargs, False
        _hold(args[0], call, names, [m for m in metrics if m not in kept])
        call["metrics"] = kept
        return args[:1], call, not (kept or call.get("params") or call.get("tags"))
    except Exception as error:  # noqa: BLE001 - the user's call goes on as it was
        warn_once("user-budget", "hvd-mlflow: could not check your metric names against the run's limit (%s: %s)",
                  type(error).__name__, error)  # fmt: skip
        return args, kwargs, False


def _hold(client: Any, call: Mapping[str, Any], names: metric_budget.RunNames, metrics: list[Any]) -> None:
    """The user's values of names that do not fit in the run: one CSV artifact (name, step, value, timestamp) in the
    run, written now, under a name of its own (AzureML never overwrites an artifact), and one warning per name."""
    for metric in metrics:
        warn_once(f"user-over-budget:{metric.key}",
                  "hvd-mlflow: this run keeps at most %d metric names and holds %d: your metric %r is not logged as a "
                  "metric; its values are kept in the artifact hvd_mlflow/user-metrics-over-budget-*.csv. Log fewer "
                  "names (rank_spread, log_every_n_steps) or set max_metric_names.",
                  names.limit, len(names.names), metric.key)  # fmt: skip
    rows = "".join(f"{m.key},{m.step},{m.value!r},{m.timestamp}\n" for m in metrics)
    path = f"hvd_mlflow/user-metrics-over-budget-{uuid.uuid4().hex[:12]}.csv"
    with internal():
        client.log_text(call["run_id"], "name,step,value,timestamp\n" + rows, path)


StandIn = Callable[[Mapping[str, Any]], Any]  # the call's arguments by name -> what other ranks return


def _rank_zero_only(name: str, original: Callable[..., Any], elsewhere: StandIn | None = None):
    """``original`` on rank 0; on other ranks one warning, and ``elsewhere(arguments)`` as the result (what MLflow's
    signature promises, :mod:`hvd_mlflow.delivery.stand_ins`), else ``None``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if _writes_here():
            if name in _METRIC_WRITES and not getattr(_local, "internal", False):
                args, kwargs, nothing_left = _within_run_budget(name, original, args, kwargs)
                if nothing_left:
                    return None
            return original(*args, **kwargs)
        _warn(name)
        return elsewhere(stand_ins.arguments(original, args, kwargs)) if elsewhere is not None else None

    return call


def _refuses_unknown_ids(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original``, but given a value of :func:`stand_ins.unknown`'s kind it raises at once, on any rank."""

    def call(*args: Any, **kwargs: Any) -> Any:
        found = stand_ins.found_in((args, tuple(kwargs.values())))
        if found is not None:
            raise stand_ins.refusal(name, found)
        return original(*args, **kwargs)

    return call


def _stand_in_run(call: Mapping[str, Any]) -> Any:
    """What ``mlflow.start_run()`` returns on ranks other than 0: a real ``mlflow.ActiveRun`` (the run asked for,
    else the job's, else a new one: :func:`stand_ins.started_run`) with empty data, that logs nothing and that
    ``mlflow.active_run()`` returns until it ends."""
    from mlflow import ActiveRun

    class StandInRun(ActiveRun):
        def __exit__(self, *exc: object) -> bool:
            _state["active"] = None
            return False

    return StandInRun(stand_ins.started_run(call))


def install_when_imported(rank: int, run_id: str | None, guard_writes: bool = True) -> None:
    """:func:`install` as soon as MLflow is imported, by the user's code or by rank 0's sender (at once if it is
    already): ``autolog()`` itself imports no MLflow, which takes a second or more. A post-import hook of ``wrapt``
    (TensorFlow's own dependency), so that ``from mlflow import log_metric`` after ``autolog()`` gets the guarded
    function too. ``guard_writes`` False (``guard_other_ranks=False``): MLflow's writes are left as they are, and
    only MLflow's own TensorFlow/Keras autologging is turned off."""
    import wrapt

    with _lock:
        _state["wanted"] = (rank, run_id, guard_writes)
        module = sys.modules.get("mlflow")
        imported = module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)
        if not _state.get("hooked"):  # wrapt calls it at once when MLflow is imported already
            _state["hooked"] = True
            wrapt.register_post_import_hook(_install_wanted, "mlflow")
        elif imported:
            _install_wanted(module)


def _install_wanted(mlflow_module: Any) -> None:
    """The post-import hook: it runs in whichever thread imports MLflow, so it never raises (one warning)."""
    with _lock:
        wanted = _state.get("wanted")
        if wanted is None:  # undone by autolog(disable=True) before MLflow was imported
            return
        try:
            rank, run_id, guard_writes = wanted
            job_mode = destination.is_azureml_job(mlflow_module.get_tracking_uri())
            install(rank, run_id, job_mode=job_mode, guard_writes=guard_writes)
        except Exception as error:  # noqa: BLE001 - an MLflow this code does not know: writes stay unguarded
            warn_once("guard-failed", "hvd-mlflow: MLflow calls on ranks other than 0 could not be guarded (%s: %s)",
                      type(error).__name__, error)  # fmt: skip


def install(rank: int, run_id: str | None, job_mode: bool = False, guard_writes: bool = True) -> None:
    """Guard MLflow in this process (once; :func:`uninstall` undoes it). Every wrapper asks the rank at call
    time; ``rank`` is the rank now, for the record. MLflow's own TensorFlow/Keras autologging is off on every rank,
    with or without ``guard_writes`` (the writes of ranks other than 0 made no-ops)."""
    import mlflow
    from mlflow.utils.import_hooks import register_post_import_hook

    if _state["rank"] is not None:
        return
    _state["rank"] = rank
    for module_name in AUTOLOG_FLAVOURS:
        register_post_import_hook(_guard_flavour_autolog, module_name, overwrite=False)
        if module_name in sys.modules:
            _guard_flavour_autolog(sys.modules[module_name])
    if not guard_writes:
        return
    # every MLflow write on ranks other than 0 a no-op that returns what MLflow promises (stand_ins.py)
    from mlflow.tracking import fluent

    job_run = stand_ins.job_run_id(run_id, job_mode)
    stand_ins.reset(job_run)
    restore = job_run if job_mode else None  # the variable rank 0's MLflow must keep finding
    for owner in (mlflow, fluent):
        for name in FLUENT_WRITERS:
            if hasattr(owner, name):
                _patch(owner, name, _rank_zero_only(name, getattr(owner, name), stand_ins.FLUENT_RESULTS.get(name)))
        _patch(owner, "start_run", _start_run(owner.start_run, restore))
        _patch(owner, "active_run", _active_run(owner.active_run))
        _patch(owner, "end_run", _end_run(owner.end_run, restore))
    _patch(mlflow, "autolog", _rank_zero_only("autolog", mlflow.autolog))
    _guard_client()


def _keep_job_run(job_run: str | None) -> None:
    """In a job, ``MLFLOW_RUN_ID`` for rank 0's MLflow (its ``start_run`` and ``end_run`` delete it): the next
    ``start_run()`` or fluent write finds the job's run instead of creating one beside it."""
    if job_run:
        os.environ.setdefault(destination.RUN_ID_VARIABLE, job_run)


def _start_run(original: Callable[..., Any], job_run: str | None) -> Callable[..., Any]:
    def start_run(*args: Any, **kwargs: Any) -> Any:
        if not _writes_here():
            _warn("start_run")
            _state["active"] = _stand_in_run(stand_ins.arguments(original, args, kwargs))
            return _state["active"]
        _keep_job_run(job_run)
        try:
            return original(*args, **kwargs)
        finally:
            _keep_job_run(job_run)

    return start_run


def _active_run(original: Callable[..., Any]) -> Callable[..., Any]:
    def active_run() -> Any:
        return original() if _writes_here() else _state["active"]

    return active_run


def _end_run(original: Callable[..., Any], job_run: str | None) -> Callable[..., Any]:
    def end_run(*args: Any, **kwargs: Any) -> Any:
        if _writes_here():
            try:
                return original(*args, **kwargs)
            finally:
                _keep_job_run(job_run)
        _state["active"] = None
        return None

    return end_run


def _guard_client() -> None:
    """Every write method of ``MlflowClient``, and ``Model.log`` (every flavour's ``log_model``): rank 0 only.
    Every read method: refused at once when given a stand-in's unknown id (on any rank, and cheap: a scan of its
    arguments)."""
    from mlflow import MlflowClient
    from mlflow.models import Model

    for name in dir(MlflowClient):
        original = getattr(MlflowClient, name)
        # _create_model_version: mlflow.register_model's own way to a new version
        if (name.startswith(CLIENT_WRITE_PREFIXES) or name == "_create_model_version") and callable(original):
            stand_in = stand_ins.CLIENT_RESULTS.get(name)
            _patch(MlflowClient, name, _rank_zero_only(f"MlflowClient.{name}", original, stand_in))
        elif name.startswith(CLIENT_READ_PREFIXES) and inspect.isfunction(inspect.getattr_static(MlflowClient, name)):
            _patch(MlflowClient, name, _refuses_unknown_ids(f"MlflowClient.{name}", original))
    raw = Model.__dict__.get("log")
    if raw is not None and not getattr(raw, "_hvd_mlflow_guard", False):
        _originals.append((Model, "log", raw))  # the classmethod itself, so that uninstall() restores it as one
        model_info = lambda call: stand_ins.model_info(call, _state["active"])  # noqa: E731
        replacement = classmethod(_rank_zero_only("<flavour>.log_model", raw.__func__, model_info))
        replacement._hvd_mlflow_guard = True  # type: ignore[attr-defined]
        Model.log = replacement  # type: ignore[method-assign]


def _guard_flavour_autolog(module: Any) -> None:
    if _state["rank"] is None:
        return
    original = module.autolog
    flavour = module.__name__

    def autolog(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("disable"):
            return original(*args, **kwargs)
        warn_once(
            f"guard:{flavour}",
            "hvd-mlflow: %s.autolog() is turned off while hvd_mlflow.autolog() is on: it logs each rank's local "
            "values, so every metric would be logged twice. hvd-mlflow logs the global values and the params.",
            flavour,
        )
        return original(disable=True)

    _patch(module, "autolog", autolog)
    from mlflow.utils.autologging_utils import AUTOLOGGING_INTEGRATIONS

    config = AUTOLOGGING_INTEGRATIONS.get(getattr(original, "integration_name", None) or "")
    if config and not config.get("disable", False):
        autolog()  # it was enabled before hvd_mlflow.autolog(): turn it off (with the warning)


def uninstall() -> None:
    """Restore everything :func:`install` replaced."""
    with _lock:
        while _originals:
            owner, name, original = _originals.pop()
            setattr(owner, name, original)
        _state["rank"] = None
        _state["active"] = None
        _state["wanted"] = None
        stand_ins.reset()
