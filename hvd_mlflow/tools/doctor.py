"""What this environment will do with hvd-mlflow, in one screen (``hvd-mlflow doctor``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import platform
from collections.abc import Callable

from ..common import compat, dependencies, topology
from ..common.dependencies import installed_version
from ..common.redact import mask_uri
from ..delivery import destination, journal
from ..errors import LauncherMismatchError
from ..every_rank import keras_flavour


@dataclasses.dataclass
class Check:
    name: str
    value: str
    ok: bool = True
    fix: str = ""
    warning: str = ""  # works, but with a known limit: said, not an error


def _guard(name: str, fix: str, probe: Callable[[], Check]) -> Check:
    try:
        return probe()
    except Exception as error:  # noqa: BLE001 - a doctor reports, it does not crash
        return Check(name, f"{type(error).__name__}: {error}"[:200], ok=False, fix=fix)


def checks() -> list[Check]:
    out = [Check("python", platform.python_version())]
    out.append(_guard("keras", dependencies.KERAS, _keras))

    def tensorflow() -> Check:
        if importlib.util.find_spec("tensorflow") is None and _backend() not in ("tensorflow", ""):
            return Check("tensorflow", f"not installed: not needed on Keras 3's {_backend()} backend")
        import tensorflow as tf

        flavour = keras_flavour.of_tf_keras()
        legacy = keras_flavour.legacy_setting()
        return Check("tensorflow", f"{tf.__version__}; tf.keras is {flavour} {keras_flavour.version(flavour)} "
                     f"(TF_USE_LEGACY_KERAS={legacy or 'unset'})")  # fmt: skip

    out.append(_guard("tensorflow", dependencies.TENSORFLOW, tensorflow))

    def horovod() -> Check:
        if not dependencies.horovod_installed():  # the tf.distribute engine and one process need none
            return Check("horovod", "not installed: Horovod jobs need it (horovodrun, mpirun); tf.distribute jobs "
                         "(TF_CONFIG) and one process do not")  # fmt: skip
        import horovod
        import horovod.tensorflow as hvd

        controllers = [n for n, f in (("gloo", hvd.gloo_built), ("mpi", hvd.mpi_built)) if f()]
        keras_layer = "broken on Keras 3 (hvd-mlflow does not use it)" if _keras3() else "usable"
        return Check("horovod", f"{horovod.__version__}; controllers {', '.join(controllers) or 'none'}; "
                     f"Horovod's Keras callbacks: {keras_layer}", ok=bool(controllers),
                     fix=dependencies.HOROVOD_GLOO)  # fmt: skip

    out.append(_guard("horovod", f"build horovod 0.28.1 against this TensorFlow: {dependencies.HOROVOD}", horovod))
    out.append(_guard("engine", "run it under the job's launcher: mpirun -np N hvd-mlflow doctor", _ranks))
    out.append(_guard("mlflow", dependencies.MLFLOW, lambda: Check("mlflow", compat.mlflow_version())))

    def tracking() -> Check:
        import mlflow

        uri = mlflow.get_tracking_uri()
        if not reports():  # under mpirun only rank 0 ever talks to the tracking server, the doctor too
            return Check("tracking URI", f"{mask_uri(uri)} (probed by rank 0 only)")
        reachable, detail = _probe(uri)
        fix = "" if reachable else "start the server or fix MLFLOW_TRACKING_URI; metrics are journaled meanwhile"
        return Check("tracking URI", f"{mask_uri(uri)} ({detail})", ok=reachable, fix=fix)

    out.append(_guard("tracking URI", "check MLFLOW_TRACKING_URI", tracking))
    plugin = installed_version("azureml-mlflow")
    uri = destination.tracking_uri_from_environment() or ""
    uses = destination.is_azureml(uri)
    out.append(Check("azureml plugin", f"{plugin or 'not installed'}; {'used' if uses else 'not used'}",
                     ok=bool(plugin) or not uses, fix=dependencies.AZUREML))  # fmt: skip
    out.append(_guard("support matrix", "compare with docs/support-matrix.md", lambda: _row(plugin)))
    try:
        out.extend(_combination(plugin, uses))
    except Exception as error:  # noqa: BLE001 - a doctor reports, it does not crash
        out.append(Check("combination", f"{type(error).__name__}: {error}"[:200], ok=False, fix=dependencies.MLFLOW))
    job = destination.is_azureml_job(uri)
    out.append(Check("AzureML job mode", "yes: logs into the job's run, never creates or ends runs" if job else "no"))
    out.append(_guard("per-run limits", "fix the HVD_MLFLOW_* variable it names", lambda: _budget(uri)))
    pending = sum(_pending(p) for p in journal.find())  # read-only: a training may be writing them
    out.append(Check("pending journal entries", f"{pending} in {journal.default_directory()}", ok=pending == 0,
                     fix="upload them: hvd-mlflow sync" if pending else ""))  # fmt: skip
    return out


def _pending(path) -> int:
    try:
        return journal.pending_count(path)
    except journal.NotAJournal:
        return 0


def _ranks() -> Check:
    """The engine and this process's place in the job. Under an MPI launcher (``mpirun -np N hvd-mlflow doctor``, as
    AzureML starts a job) Horovod is initialised and every rank's host gathered: the world size, ranks per host, rank
    0's host; a Horovod that sees a world of 1 where the launcher started N is named. Under ``TF_CONFIG`` (AzureML's
    ``distribution: type: tensorflow``): the tf.distribute world and its chief, the task that logs."""
    launched = topology.launcher_world()
    cluster = topology.tf_cluster()
    if (launched is None or launched[0] <= 1) and cluster is not None and cluster.size > 1:
        return _tf_distribute(cluster)
    if launched is None or launched[0] <= 1:
        where = topology.current()
        return Check("engine", f"one process: rank {where.rank} of {where.size} (from {where.source})")
    if _backend() == "jax" and not dependencies.horovod_installed():
        rank = topology.current().rank
        return Check("engine", f"keras.distribution on JAX: {launched[1]} started {launched[0]} processes; this is "
                     f"process {rank}; process 0 logs once keras.distribution.initialize() joins them (JAX reads "
                     "Open MPI's or KERAS_DISTRIBUTION_* variables)")  # fmt: skip
    import horovod.tensorflow as hvd

    hvd.init()
    try:
        topology.check_horovod_world(hvd.size(), mpi_built=hvd.mpi_built())
    except LauncherMismatchError as error:
        return Check("engine", f"{launched[1]} started {launched[0]} processes, Horovod sees 1 in each", ok=False,
                     fix=str(error).split(": ", 1)[1])  # fmt: skip
    hosts = hvd.allgather_object(topology.hostname(), name="hvd_mlflow.doctor")
    per_host = sorted({hosts.count(h) for h in hosts})
    counts = "/".join(map(str, per_host))
    return Check("engine", f"horovod: world of {hvd.size()} on {len(set(hosts))} hosts, {counts} ranks per host "
                 f"({topology.describe_hosts(hosts)}); rank 0 on {hosts[0]}; Horovod's controller: "
                 f"{'MPI' if hvd.mpi_enabled() else 'Gloo'}")  # fmt: skip


def _tf_distribute(cluster: topology.TfCluster) -> Check:
    """What ``TF_CONFIG`` says: the tf.distribute world, this task, and the chief (rank 0: the one that logs). Read
    without starting the strategy (that would wait for every worker): a model built inside a
    MultiWorkerMirroredStrategy's ``scope()`` trains and logs so; one built outside it is refused at train begin."""
    import json

    config = json.loads(os.environ["TF_CONFIG"])
    spec, task = config.get("cluster", {}), config.get("task", {})
    if cluster.parameter_servers:
        return Check("engine", f"tf.distribute ParameterServerStrategy cluster: only the chief runs fit and logs; "
                     f"this task is {task.get('type')} {task.get('index', 0)}")  # fmt: skip
    chief = ("chief", spec["chief"][0]) if spec.get("chief") else ("worker 0", (spec.get("worker") or ["?"])[0])
    here = f"{task.get('type', 'worker')} {task.get('index', 0)} (rank {cluster.rank})"
    warning = ""
    if keras_flavour.of_tf_keras() == "keras" and _keras3():
        warning = ("Keras 3 cannot train with MultiWorkerMirroredStrategy (keras-team/keras#20585): hvd-mlflow "
                   "refuses it at train begin; use tf_keras (pip install tf-keras, TF_USE_LEGACY_KERAS=1)")  # fmt: skip
    return Check("engine", f"tf.distribute (TF_CONFIG): a world of {cluster.size} workers; this task is {here}; the "
                 f"chief, which logs, is {chief[0]} at {chief[1]}", warning=warning)  # fmt: skip


def reports() -> bool:
    """Whether this process prints the report: rank 0 under an MPI launcher (after :func:`checks` joined Horovod);
    every process otherwise (each of a tf.distribute job's tasks says where it stands: no collective joins them)."""
    launched = topology.launcher_world()
    return launched is None or launched[0] <= 1 or topology.current().rank == 0


def _budget(uri: str) -> Check:
    """The metric-name budget and row limit that apply to a run here."""
    from ..config import Options
    from ..delivery.limits import for_tracking_uri

    options = Options.resolve()
    limits = for_tracking_uri(uri).with_options(options.max_metric_names, options.max_rows_per_metric)
    names = limits.metric_names_per_run
    rows = limits.rows_per_metric
    value = (
        (f"{names} metric names per run" if names else "no metric-name budget")
        + (f", {rows:,} rows per metric" if rows else "")
        + (f", {limits.tags_per_run} tags" if limits.tags_per_run else "")
    )
    return Check("per-run limits", value)


def environment_row(plugin: str | None) -> compat.Row:
    """This environment's versions, in the support matrix's terms."""
    python = ".".join(platform.python_version_tuple()[:2])
    try:
        import tensorflow as tf
    except ImportError:  # Keras 3 on another backend (the JAX row), or no Keras at all
        keras = "keras 3" if _backend() not in ("", "tensorflow") else ""
        return compat.Row("here", "this environment", python, "", keras, compat.mlflow_version(), plugin)
    flavour = keras_flavour.of_tf_keras()
    keras = f"{flavour} {keras_flavour.version(flavour).split('.')[0]}"
    return compat.Row("here", "this environment", python, tf.__version__, keras, compat.mlflow_version(), plugin)


def _row(plugin: str | None) -> Check:
    row, different = compat.closest_row(environment_row(plugin))
    where = f"row '{row.stands_for}' (requirements/{row.name}.txt)"
    return Check("support matrix", f"{'is' if not different else 'closest to'} {where}"
                 + (f"; differs in {', '.join(different)}" if different else ""))  # fmt: skip


def _combination(plugin: str | None, uses_azureml: bool) -> list[Check]:
    """The known-bad combinations of MLflow and AzureML here: a failure each, or one line saying there is none."""
    problems = compat.known_problems(compat.mlflow_version(), plugin, compat.declared_mlflow_range(), uses_azureml)
    if not problems:
        return [Check("combination", "no known-bad combination of MLflow and azureml-mlflow")]
    out = []
    for fatal, what in problems:
        value, advice = what.split(": ", 1)
        warning = "" if fatal else advice
        out.append(Check("combination", value, ok=not fatal, fix=advice if fatal else "", warning=warning))
    return out


def _backend() -> str:
    """Keras 3's backend here (``KERAS_BACKEND``, else Keras' config), ``"tensorflow"`` where tf.keras is tf_keras or
    Keras 2, ``""`` without Keras: read without importing a backend."""
    if keras_flavour.of_tf_keras() == "tf_keras" or importlib.util.find_spec("keras") is None:
        return "tensorflow" if importlib.util.find_spec("tf_keras") else ""
    import keras

    return str(keras.backend.backend()) if keras.__version__.startswith("3") else "tensorflow"


def _keras() -> Check:
    """Which Keras trains here, and on which backend (Keras 3: JAX, PyTorch or TensorFlow), and the engines that
    backend can use."""
    backend = _backend()
    if not backend:
        return Check("keras", "not installed", ok=False, fix=dependencies.KERAS)
    flavour = keras_flavour.of_tf_keras()
    engines = {
        "jax": "keras.distribution across processes, or one process",
        "tensorflow": "Horovod, tf.distribute (tf_keras), or one process",
    }.get(backend, "one process (hvd-mlflow has no multi-process engine for this backend yet)")
    return Check("keras", f"{flavour} {keras_flavour.version(flavour)}, backend {backend} "
                 f"(KERAS_BACKEND={os.environ.get('KERAS_BACKEND', 'unset')}); engines: {engines}")  # fmt: skip


def _keras3() -> bool:
    flavour = keras_flavour.of_tf_keras()
    return flavour == "keras" and keras_flavour.version("keras").startswith("3")


def _probe(uri: str) -> tuple[bool, str]:
    """Whether the tracking store answers (``/health`` for a server, the file for sqlite)."""
    if uri.startswith(("http://", "https://")):
        import requests

        try:
            response = requests.get(uri.rstrip("/") + "/health", timeout=5)
            return response.ok, f"/health answered {response.status_code}"
        except requests.RequestException as error:
            return False, f"does not answer: {type(error).__name__}"
    if uri.startswith("sqlite:"):
        return True, "embedded sqlite store, created on first use"
    if destination.is_azureml(uri):
        return bool(os.environ.get("MLFLOW_TRACKING_TOKEN")), "azureml: needs MLFLOW_TRACKING_TOKEN in the job"
    return True, "not probed"
