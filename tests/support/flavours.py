"""The Keras flavours this environment can import: what the tests that run once per flavour run for."""

from __future__ import annotations

import importlib
import importlib.util

from hvd_mlflow.every_rank.keras_flavour import FLAVOURS


def importable() -> list[str]:
    """The flavours that can be imported in this environment."""
    found = []
    for flavour in FLAVOURS:
        if importlib.util.find_spec(flavour) is None:
            continue
        try:
            importlib.import_module(flavour)
        except Exception:  # noqa: BLE001 - a broken install is simply not a usable flavour
            continue
        found.append(flavour)
    return found
