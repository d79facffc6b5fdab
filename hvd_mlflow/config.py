"""Options of :func:`hvd_mlflow.autolog` and the callback, with their ``HVD_MLFLOW_*`` environment variables.

An argument given in code wins over the environment variable, which wins over the default. Options are
resolved once: ``autolog()`` resolves :class:`AutologOptions` and hands them to every callback it adds; a
callback built by hand resolves :class:`Options`. The docstring of :class:`Options` is the one description of
each option (docs/reference.md is checked against it by the tests).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

ENV_PREFIX = "HVD_MLFLOW_"
REDUCTIONS = ("exact", "weighted", "mean")
RESUME_POLICIES = ("skip", "log")
_BOOLEANS = {**dict.fromkeys(("1", "true", "yes", "on"), True), **dict.fromkeys(("0", "false", "no", "off"), False)}
COLLECTIVE = ("reduction", "log_every_n_steps", "rank_spread", "check_divergence", "system_metrics")


@dataclasses.dataclass(frozen=True)
class Options:
    """What the callback does; every field has an ``HVD_MLFLOW_<FIELD>`` variable.

    Attributes:
        reduction: how each rank's values become one: ``exact`` (metrics computed from their state summed over
            ranks), ``weighted`` (mean weighted by samples) or ``mean`` (Horovod's unweighted mean).
        flush_timeout: seconds ``fit`` waits at its end for rank 0 to deliver what is still queued.
        run_wait: under Horovod elastic, seconds rank 0 waits at train begin for a new run to be opened (so
            that every rank knows it before a reset), and at the end of ``fit`` at most for the run the model is
            logged in (not once the server is known down); nothing else waits: the run is opened once the first
            epoch has ended (or 10 s into it: MLflow is imported after Keras' tracing) and its id reaches the other
            ranks in the first epoch collective after that (rank 0 has it at the end of ``fit`` in any case).
            Logging goes on either way.
        extra_tags: tags added to the run.
        extra_params: params added to the run (your hyperparameters, for example).
        journal_dir: where rank 0 keeps its journal (default ``.hvd_mlflow/journal`` in the working
            directory; in an AzureML job ``outputs/hvd_mlflow_journal``, which AzureML keeps with the job's run);
            ``hvd-mlflow sync`` looks there by default.
        silent: no warnings from hvd-mlflow (errors are still raised).
        csv_path: rank 0 also writes the global values to this file with Keras' own ``CSVLogger`` (the seed
            recipe's format, appending when ``fit`` resumes), so existing pandas notebooks keep working.
        log_every_n_steps: also log batch-level values every N training batches (0: off), under
            ``batch/<name>`` keys at the global step (the optimizer's iteration count), reduced over ranks like
            the epoch values (in bulk: one collective per ~100 optimizer steps, and the epoch's). Keras reports
            at a batch the running value since the epoch began.
        rank_spread: metric keys (e.g. ``loss,val_loss``) whose minimum and maximum over ranks are logged too,
            as ``<key>_rank_min`` / ``<key>_rank_max``, from the same collective (to spot a bad shard).
        resume: what to do with epochs the run already holds (a restarted job attaching to its run, a second
            ``fit``): ``skip`` (default) sends nothing at or below a metric's last logged step and keeps params
            that are unchanged (changed ones are warned about and kept in a JSON artifact);
            ``log`` sends everything again.
        log_models: rank 0 logs the trained model at the end of ``fit``: an MLflow model
            where the server supports logged models, plain artifacts (``model/``) on AzureML. Default: on
            outside AzureML jobs, off inside them (``HVD_MLFLOW_LOG_MODELS=1`` turns it on).
        max_metric_names: how many metric names a run may hold (default: the server's limit, 50 on AzureML,
            none elsewhere; 0: no limit). Names that do not fit are not logged as metrics; their values go to a
            CSV artifact, and one warning names them (see :mod:`hvd_mlflow.delivery.metric_budget` for the order).
        max_rows_per_metric: how many values one metric name may hold (default: the server's limit, 1 million on
            AzureML; 0: no limit). ``log_every_n_steps`` is raised, with one warning, so that this fit's
            ``batch/`` curves fit in it.
        check_divergence: every epoch, check in the same collective that every rank holds the same weights (a
            fingerprint of them); when they differ, every rank warns once and rank 0 tags the run and logs
            ``weights_rank_spread`` (see :mod:`hvd_mlflow.every_rank.divergence`). On by default.
        system_metrics: every rank samples its CPU, memory (and GPU) in a thread; rank 0 logs their minimum, mean
            and maximum over ranks and the rank of the maximum as ``system/...`` (see
            :mod:`hvd_mlflow.every_rank.system_metrics`). Off by default.
        allow_world_of_one: each process is meant to train alone although its launcher started several (an MPI
            launcher's world larger than Horovod's, as with ``hvd.init(comm=...)``; or ``TF_CONFIG`` naming several
            workers for a model built outside ``strategy.scope()``). Off by default: such a job is refused at train
            begin on every process, since every process would log as rank 0 into the same run (see
            :mod:`hvd_mlflow.common.topology`).
    """

    reduction: str = "exact"
    flush_timeout: float = 60.0
    run_wait: float = 5.0
    extra_tags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    extra_params: Mapping[str, str] = dataclasses.field(default_factory=dict)
    journal_dir: str = ""
    silent: bool = False
    csv_path: str = ""
    log_every_n_steps: int = 0
    rank_spread: tuple[str, ...] = ()
    resume: str = "skip"
    log_models: bool | None = None
    max_metric_names: int | None = None
    max_rows_per_metric: int | None = None
    check_divergence: bool = True
    system_metrics: bool = False
    allow_world_of_one: bool = False

    def __post_init__(self) -> None:
        """Every way to make options checks them (``resolve``, and an ``Options`` passed as ``options=``)."""
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction={self.reduction!r}: choose one of {', '.join(REDUCTIONS)}")
        if self.resume not in RESUME_POLICIES:
            raise ValueError(f"resume={self.resume!r}: choose one of {', '.join(RESUME_POLICIES)}")
        for name in ("log_every_n_steps", "max_metric_names", "max_rows_per_metric"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: give 0 (off) or a positive number")

    @classmethod
    def resolve(cls, environ: Mapping[str, str] = os.environ, **given: Any) -> Options:
        """Build options from explicit arguments (``None`` means not given), then ``HVD_MLFLOW_*``."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            value = given.pop(field.name, None)
            if value is None:
                raw = environ.get(ENV_PREFIX + field.name.upper())
                if raw is not None and raw != "":
                    value = _parse(field.name, raw, field.type)
            if value is not None:
                values[field.name] = value
        if given:
            raise TypeError(f"unknown option(s): {', '.join(sorted(given))}")
        options = cls(**values)
        spread = options.rank_spread
        spread = _split(spread) if isinstance(spread, str) else tuple(str(key) for key in spread)
        return dataclasses.replace(options, rank_spread=spread)

    @classmethod
    def for_callback(cls, **given: Any) -> Options:
        """The callback's options: ``options=`` an already resolved object (what ``autolog()`` passes), else
        resolved from ``given`` and the environment."""
        resolved = given.pop("options", None)
        if resolved is not None:
            if given:
                raise TypeError(f"give options= or option values, not both ({', '.join(sorted(given))})")
            return resolved
        autolog = {field.name for field in dataclasses.fields(AutologOptions)}
        autolog_only = sorted(set(given) & (autolog - {field.name for field in dataclasses.fields(Options)}))
        if autolog_only:
            raise TypeError(f"{', '.join(autolog_only)}: an option of hvd_mlflow.autolog() only")
        return cls.resolve(**given)

    def collective(self) -> tuple[tuple[str, Any], ...]:
        """The options that decide which collectives every rank runs: ranks must agree on them."""
        return tuple((name, getattr(self, name)) for name in COLLECTIVE)


@dataclasses.dataclass(frozen=True)
class AutologOptions(Options):
    """The options of :func:`hvd_mlflow.autolog`: every option of :class:`Options`, and:

    Attributes:
        guard_other_ranks: MLflow writes from user code on ranks other than 0 do nothing (see
            :mod:`hvd_mlflow.delivery.mlflow_calls`).
        log_tensorboard: at the end of ``fit`` (after TensorBoard has closed its files) rank 0 uploads the files of
            each Keras ``TensorBoard`` callback's log folder that this ``fit`` created or changed into the run's
            artifacts (``tensorboard/``), within ``flush_timeout``; ``hvd-mlflow sync`` sends what could
            not be sent (see :mod:`hvd_mlflow.every_rank.tensorboard`). On by default.
        tensorboard_profile: include the profiler's traces (``plugins/profile/``, from ``profile_batch``) in that
            upload. Off by default: they are often hundreds of MB.
        tensorboard_per_rank: ranks other than 0 keep their ``TensorBoard`` callback, writing into
            ``<log_dir>/rank-<N>/``, which stays on each rank's disk (never uploaded). Off by default: only rank 0's
            callback runs, and it shows the global values.
    """

    guard_other_ranks: bool = True
    log_tensorboard: bool = True
    tensorboard_profile: bool = False
    tensorboard_per_rank: bool = False


def environment_value(name: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The raw ``HVD_MLFLOW_<NAME>`` variable of option ``name`` (``None`` when unset or empty)."""
    return environ.get(ENV_PREFIX + name.upper()) or None


def _parse(name: str, raw: str, kind: Any) -> Any:
    kind = str(kind)
    try:
        if kind == "float":
            return float(raw)
        if kind in ("int", "int | None"):
            return int(raw)
        if kind.startswith("tuple"):
            return _split(raw)
        if kind.startswith("bool"):
            return _BOOLEANS[raw.strip().lower()]
        if kind.startswith("Mapping"):
            pairs = (item.split("=", 1) for item in raw.split(",") if item.strip())
            return {k.strip(): v.strip() for k, v in pairs}
    except (ValueError, KeyError):
        raise ValueError(
            f"{ENV_PREFIX}{name.upper()}={raw!r} is not a valid {kind}; unset it or give a valid value"
        ) from None
    return raw


def _split(raw: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in raw.split(",") if item.strip())
