"""Keep MLflow writes to one writer: rank 0.

In an AzureML job every rank inherits the job's run id, so any ``mlflow.log_*``, ``mlflow.start_run``,
``mlflow.autolog`` or ``mlflow.<flavour>.autolog`` in user code writes duplicate points into the job's run from
every rank (outside AzureML it creates one stray run per rank). :func:`install` makes them no-ops on ranks
other than 0, each with one warning that says why. On rank 0 the user's own ``mlflow.log_*`` calls keep
working.

MLflow's TensorFlow/Keras autologging is turned off on every rank while ``hvd_mlflow.autolog()`` is on: it
logs each rank's local values, per epoch and at every validation, so every Keras metric would be there twice
(``log_every_epoch=False`` does not stop its validation logging). hvd-mlflow logs the params itself. Its
modules import TensorFlow, so they are patched when the user imports them (MLflow's own post-import hooks).

In an AzureML job, MLflow's ``start_run()`` deletes ``MLFLOW_RUN_ID`` from the environment when it attaches to
the job's run, so the next ``mlflow.log_metric`` after that run ends would create a new run beside the job's.
On rank 0 the variable is put back after each ``start_run``.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ._log import warn_once

FLUENT_WRITERS = (
    "log_metric", "log_metrics", "log_param", "log_params", "set_tag", "set_tags", "delete_tag", "log_artifact",
    "log_artifacts", "log_dict", "log_text", "log_figure", "log_image", "log_table", "log_input", "log_inputs",
    "set_experiment",
)  # fmt: skip
AUTOLOG_FLAVOURS = ("mlflow.tensorflow", "mlflow.keras")

_originals: list[tuple[object, str, Any]] = []
_state: dict[str, int | None] = {"rank": None}


def _patch(owner: object, name: str, replacement: Callable[..., Any]) -> None:
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_hvd_mlflow_guard", False):
        return
    _originals.append((owner, name, original))
    functools.update_wrapper(replacement, original)
    replacement._hvd_mlflow_guard = True  # type: ignore[attr-defined]
    setattr(owner, name, replacement)


def _silenced(name: str, rank: int) -> Callable[..., Any]:
    def noop(*args: Any, **kwargs: Any) -> None:
        warn_once(
            f"guard:{name}",
            "hvd-mlflow: mlflow.%s() on rank %d does nothing: only rank 0 writes to MLflow (every rank shares the "
            "job's run, so other ranks would add duplicate points). Pass autolog(guard_other_ranks=False) to allow it.",
            name,
            rank,
        )

    return noop


class _NoRun:
    """What ``mlflow.start_run()`` returns on ranks other than 0: a context manager that logs nothing."""

    def __init__(self, run_id: str | None) -> None:
        self.info = SimpleNamespace(run_id=run_id, status="RUNNING")
        self.data = SimpleNamespace(metrics={}, params={}, tags={})

    def __enter__(self) -> _NoRun:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False


def install(rank: int, run_id: str | None, job_mode: bool = False) -> None:
    """Guard MLflow in this process (once; :func:`uninstall` undoes it)."""
    import mlflow
    from mlflow.tracking import fluent
    from mlflow.utils.import_hooks import register_post_import_hook

    if _state["rank"] is not None:
        return
    _state["rank"] = rank
    if rank != 0:
        for name in FLUENT_WRITERS:
            for owner in (mlflow, fluent):
                _patch(owner, name, _silenced(name, rank))
        for owner in (mlflow, fluent):
            _patch(owner, "start_run", _no_run(rank, run_id))
        _patch(mlflow, "autolog", _silenced("autolog", rank))
    elif job_mode and run_id:
        _keep_job_run_id(run_id)
    for module_name in AUTOLOG_FLAVOURS:
        register_post_import_hook(_guard_flavour_autolog, module_name, overwrite=False)
        if module_name in sys.modules:
            _guard_flavour_autolog(sys.modules[module_name])


def _no_run(rank: int, run_id: str | None) -> Callable[..., _NoRun]:
    warn = _silenced("start_run", rank)

    def start_run(*args: Any, **kwargs: Any) -> _NoRun:
        warn()
        return _NoRun(run_id)

    return start_run


def _keep_job_run_id(run_id: str) -> None:
    import mlflow
    from mlflow.tracking import fluent

    original = mlflow.start_run

    def start_run(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            os.environ.setdefault("MLFLOW_RUN_ID", run_id)

    for owner in (mlflow, fluent):
        _patch(owner, "start_run", start_run)


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
    config = _autolog_config(getattr(original, "integration_name", None))
    if config is not None and not config.get("disable", False):
        autolog()  # it was enabled before hvd_mlflow.autolog(): turn it off (with the warning)


def _autolog_config(integration: str | None) -> dict | None:
    if not integration:
        return None
    from mlflow.utils.autologging_utils import AUTOLOGGING_INTEGRATIONS

    config = AUTOLOGGING_INTEGRATIONS.get(integration)
    return dict(config) if config else None


def uninstall() -> None:
    """Restore everything :func:`install` replaced."""
    while _originals:
        owner, name, original = _originals.pop()
        setattr(owner, name, original)
    _state["rank"] = None
