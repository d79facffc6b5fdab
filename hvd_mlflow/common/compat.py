"""Which versions this is and what follows from them: the one module for version checks.

* MLflow 2.x and 3.x differ where hvd-mlflow calls them: a flavour's ``log_model`` names the model ``artifact_path``
  in 2.x and ``name`` in 3.x; MLflow 3 links a model to a *logged model* (an API AzureML answers with 404), 2.x has
  none; ``ModelInfo`` takes different arguments.
* The rows of the support matrix (docs/support-matrix.md; each pinned by ``requirements/<row>.txt``): which one an
  environment is closest to, and the combinations known not to work (``hvd-mlflow doctor``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import inspect
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from .dependencies import installed_version

MLFLOW_FLOOR = "2.12.2"  # setup.cfg's lower bound: the oldest row tests it


def parse(version: str | None) -> tuple[int, ...]:
    """``"3.17.2"`` -> ``(3, 17, 2)``; ``"1.62.0.post6"`` -> ``(1, 62, 0)``; ``"2.16.0rc1"`` -> ``(2, 16, 0)``."""
    found = re.match(r"\d+(?:\.\d+)*", version or "")
    return tuple(int(part) for part in found.group().split(".")) if found else ()


def mlflow_version() -> str:
    import mlflow

    return mlflow.__version__


def mlflow3(version: str | None = None) -> bool:
    """Whether this MLflow has MLflow 3's model API (logged models, ``log_model(name=...)``)."""
    return parse(version or mlflow_version()) >= (3,)


def default_tracking_uri(directory: str = "") -> str:
    """MLflow's tracking URI for this process: ``MLFLOW_TRACKING_URI``, else MLflow's default store (3.x: SQLite
    ``mlflow.db``, 2.x: ``mlruns/``) in ``directory`` (default: the working directory). For a command line."""
    import mlflow

    if not directory or not os.path.isdir(directory):
        return mlflow.get_tracking_uri()
    here = os.getcwd()
    os.chdir(directory)  # MLflow makes its default store's path absolute against the working directory
    try:
        return mlflow.get_tracking_uri()
    finally:
        os.chdir(here)


def command_line_client(tracking_uri: str) -> Any:
    """An ``MlflowClient`` for a command (``sync``, ``import-csv``): MLflow 2.x's ``mlflow-artifacts`` repository
    takes the tracking URI from MLflow's global setting, not from the client (with ``--tracking-uri`` and no
    ``MLFLOW_TRACKING_URI``, uploading an artifact failed: "the configured tracking uri scheme: 'file' is invalid"),
    so there the command's process sets it too; MLflow 3 passes the client's on."""
    import mlflow

    if not mlflow3():
        mlflow.set_tracking_uri(tracking_uri)
    return mlflow.MlflowClient(tracking_uri)


def accepted(factory: Callable[..., Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` without those ``factory`` does not take in this MLflow (``ModelInfo``'s ``logged_model``,
    ``prompts``... are MLflow 3's)."""
    parameters = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(arguments)
    return {k: v for k, v in arguments.items() if k in parameters}


@functools.cache
def names_take_colons() -> bool:
    """Whether this MLflow accepts ``:`` in metric and param names (2.13 onwards, not on Windows). Read from the
    installed version, not by importing MLflow's validator: names are cleaned at the first epoch end on every rank's
    training thread, where importing MLflow took over a second (and waited for rank 0's sender importing it). The
    same on every rank of a job (one environment); tests/unit/test_compat.py holds it against MLflow's own check."""
    version = installed_version("mlflow-skinny") or installed_version("mlflow")
    return os.name != "nt" and parse(version) >= (2, 13)


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the support matrix: a population of users, and the versions that stand for it."""

    name: str  # requirements/<name>.txt
    stands_for: str
    python: str
    tensorflow: str
    keras: str  # what tf.keras is: "keras 3", "tf_keras 2" (TF_USE_LEGACY_KERAS=1), "keras 2"
    mlflow: str
    azureml_mlflow: str | None


ROWS = (
    Row("tf2.16", "AzureML today", "3.11", "2.16.2", "tf_keras 2", "3.15.0", "1.62.0.post6"),
    Row("newest", "plain MLflow, newest", "3.11", "2.18.1", "keras 3", "3.17.2", None),
    Row("oldest", "oldest supported", "3.10", "2.15.1", "keras 2", "2.12.2", "1.56.0"),
    Row("tfdistribute", "tf.distribute, newest TensorFlow", "3.11", "2.21.0", "tf_keras 2", "3.15.0", "1.62.0.post6"),
    Row("jax", "Keras 3 on JAX, no TensorFlow", "3.11", "", "keras 3", "3.15.0", "1.62.0.post6"),
)
OLDEST = "oldest"  # the row of setup.cfg's lower bounds


def differences(row: Row, have: Row) -> list[str]:
    """What ``have`` (this environment) differs from ``row`` in, e.g. ``["MLflow 3.16.1 (row: 3.17.2)"]``."""
    out = []
    for label, want, got, depth in (
        ("Python", row.python, have.python, 2),
        ("TensorFlow", row.tensorflow, have.tensorflow, 2),
        ("tf.keras", row.keras, have.keras, 0),
        ("MLflow", row.mlflow, have.mlflow, 2),
        ("azureml-mlflow", row.azureml_mlflow, have.azureml_mlflow, 2),
    ):
        same = want == got if depth == 0 or not (want and got) else parse(want)[:depth] == parse(got)[:depth]
        if not same:
            out.append(f"{label} {got or 'not installed'} (row: {want or 'not installed'})")
    return out


def closest_row(have: Row) -> tuple[Row, list[str]]:
    """The row ``have`` differs from in the fewest versions (major.minor; the first row on a tie), and how."""
    ranked = [(len(differences(row, have)), index, row) for index, row in enumerate(ROWS)]
    _, _, row = min(ranked)
    return row, differences(row, have)


def declared_mlflow_range(distribution: str = "azureml-mlflow") -> str | None:
    """The ``mlflow-skinny`` specifier an installed distribution declares (``"<=3.15.0"``), ``""`` when it declares
    none, ``None`` when it is not installed."""
    from packaging.requirements import Requirement

    try:
        requires = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in requires:
        requirement = Requirement(line)
        if requirement.marker is not None and "extra" in str(requirement.marker):
            continue
        if requirement.name in ("mlflow", "mlflow-skinny"):
            return str(requirement.specifier)
    return ""


def outside(version: str, specifier: str) -> bool:
    """Whether ``version`` is outside ``specifier`` (``"<=3.15.0"``, ``">=2,<3"``); an empty specifier holds all."""
    from packaging.specifiers import SpecifierSet

    return bool(specifier) and not SpecifierSet(specifier).contains(version, prereleases=True)


def known_problems(mlflow: str, azureml_mlflow: str | None, azureml_range: str | None, uses_azureml: bool) -> list[
    tuple[bool, str]
]:  # fmt: skip
    """The combinations known not to work, as ``(fatal, what to do)``: an MLflow below the floor, an azureml-mlflow
    with an MLflow outside the range it declares, MLflow 3's logged models against AzureML."""
    out = []
    if parse(mlflow) < parse(MLFLOW_FLOOR):
        out.append((True, f"MLflow {mlflow} is older than hvd-mlflow supports: pip install 'mlflow-skinny>="
                    f"{MLFLOW_FLOOR}'"))  # fmt: skip
    if azureml_mlflow and azureml_range and outside(mlflow, azureml_range):
        out.append((True, f"azureml-mlflow {azureml_mlflow} requires mlflow-skinny{azureml_range}, this is MLflow "
                    f"{mlflow}: pip install 'mlflow-skinny{azureml_range}' (or the azureml-mlflow made for "
                    f"MLflow {mlflow})"))  # fmt: skip
    if mlflow3(mlflow) and (azureml_mlflow or uses_azureml):
        out.append((False, f"MLflow {mlflow} against AzureML: AzureML answers MLflow 3's logged-models API with 404, "
                    "so mlflow.<flavour>.log_model fails in your own code there (hvd-mlflow uploads its model as "
                    "artifacts there); mlflow-skinny<3 avoids it"))  # fmt: skip
    return out
