"""Metric and param names that MLflow and AzureML accept, never merging two names into one.

MLflow accepts letters (Unicode included), digits, ``_ - . /``, spaces and (from MLflow 2.13) ``:``, names
that do not look like other paths (``a//b``, ``/a``, ``..``), and 250 characters at most. Anything else is
cleaned (each bad character becomes ``_``) with one warning per name; two names that clean to the same one are an error.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable

from .._log import warn_once
from ..common import compat
from ..errors import MetricNameCollisionError

_BAD = re.compile(r"[^/\w.\- :]")
_BAD_WITHOUT_COLONS = re.compile(r"[^/\w.\- ]")


def clean(name: str, max_length: int = 250) -> str:
    """``name`` made acceptable to MLflow and AzureML."""
    out = (_BAD if compat.names_take_colons() else _BAD_WITHOUT_COLONS).sub("_", name)
    if posixpath.normpath(out) != out or out.startswith("/") or out in ("", ".") or out.startswith(".."):
        out = "/".join(part for part in out.split("/") if part not in ("", ".", "..")) or "_"
    return out[:max_length]


class NameMap:
    """Original name -> server name, computed once per set of names.

    Names that collide once cleaned raise :class:`MetricNameCollisionError` (metric names: computed on every
    rank, so every rank raises at the same point), or, with ``raise_on_collision=False`` (param names, which rank
    0 alone computes), are left out of the mapping and listed in :attr:`collided` for the caller to keep
    elsewhere.
    """

    def __init__(
        self, max_length: int = 250, what: str = "metric", warn: bool = True, raise_on_collision: bool = True
    ) -> None:
        self._max_length = max_length
        self._what = what
        self._warn = warn
        self._raise = raise_on_collision
        self._cache: dict[tuple[str, ...], dict[str, str]] = {}
        self.collided: set[str] = set()

    def __call__(self, names: Iterable[str]) -> dict[str, str]:
        key = tuple(names)
        if key not in self._cache:
            self._cache[key] = self._build(key)
        return self._cache[key]

    def _build(self, names: tuple[str, ...]) -> dict[str, str]:
        mapping = {name: clean(name, self._max_length) for name in names}
        by_clean: dict[str, list[str]] = {}
        for original, cleaned in mapping.items():
            by_clean.setdefault(cleaned, []).append(original)
        collisions = {c: o for c, o in by_clean.items() if len(o) > 1}
        if collisions:
            detail = "; ".join(f"{', '.join(map(repr, o))} -> {c!r}" for c, o in collisions.items())
            message = (
                f"hvd-mlflow: these {self._what} names are not accepted by MLflow/AzureML and become the "
                f"same name once cleaned, so their values would be merged: {detail}. Rename them."
            )
            if self._raise:
                raise MetricNameCollisionError(message)
            collided = {o for originals in collisions.values() for o in originals}
            self.collided |= collided
            mapping = {k: v for k, v in mapping.items() if k not in collided}
        for original, cleaned in mapping.items():
            if cleaned != original and self._warn:
                warn_once(
                    f"rename:{self._what}:{original}",
                    "hvd-mlflow: %s name %r is not accepted by MLflow/AzureML; it is logged as %r",
                    self._what,
                    original,
                    cleaned,
                )
        return mapping
