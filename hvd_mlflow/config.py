"""Options of :func:`hvd_mlflow.autolog` and the callback, with their ``HVD_MLFLOW_*`` environment variables.

An argument given in code wins over the environment variable, which wins over the default.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

ENV_PREFIX = "HVD_MLFLOW_"


@dataclasses.dataclass(frozen=True)
class Options:
    """What the callback does; every field has an ``HVD_MLFLOW_<FIELD>`` variable.

    Attributes:
        reduction: how each rank's values become one: ``exact`` (metrics computed from their state summed over
            ranks), ``weighted`` (mean weighted by samples) or ``mean`` (Horovod's unweighted mean).
        flush_timeout: seconds ``fit`` waits at its end for rank 0 to deliver what is still queued.
        run_wait: seconds rank 0 waits at train begin for the run to be opened (so that its id can be
            broadcast to every rank); logging goes on in the background either way.
        extra_tags: tags added to the run.
        extra_params: params added to the run (your hyperparameters, for example).
        journal_dir: where rank 0 keeps its journal (default ``.hvd_mlflow/journal`` in the working
            directory); ``hvd-mlflow sync`` looks there by default.
        silent: no warnings from hvd-mlflow (errors are still raised).
        csv_path: with ``autolog()``, rank 0 also writes the global values to this file with Keras' own
            ``CSVLogger`` (the seed recipe's format), so existing pandas notebooks keep working.
        guard_other_ranks: with ``autolog()``, MLflow writes from user code on ranks other than 0 do nothing
            (see :mod:`hvd_mlflow.guard`).
    """

    reduction: str = "exact"
    flush_timeout: float = 60.0
    run_wait: float = 5.0
    extra_tags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    extra_params: Mapping[str, str] = dataclasses.field(default_factory=dict)
    journal_dir: str = ""
    silent: bool = False
    guard_other_ranks: bool = True
    csv_path: str = ""

    @classmethod
    def resolve(cls, environ: Mapping[str, str] | None = None, **given: Any) -> Options:
        """Build options from explicit arguments (``None`` means not given), then ``HVD_MLFLOW_*``."""
        environ = os.environ if environ is None else environ
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
        if options.reduction not in ("exact", "weighted", "mean"):
            raise ValueError(f"reduction={options.reduction!r}: choose exact, weighted or mean")
        return options


def _parse(name: str, raw: str, kind: Any) -> Any:
    kind = str(kind)
    try:
        if kind == "float":
            return float(raw)
        if kind == "bool":
            if raw.strip().lower() in ("1", "true", "yes", "on"):
                return True
            if raw.strip().lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind.startswith("Mapping"):
            pairs = (item.split("=", 1) for item in raw.split(",") if item.strip())
            return {k.strip(): v.strip() for k, v in pairs}
    except ValueError:
        raise ValueError(
            f"{ENV_PREFIX}{name.upper()}={raw!r} is not a valid {kind}; unset it or give a valid value"
        ) from None
    return raw
