"""Test speed only: every Python process the test session starts leaves tf_keras' own functions unconverted by
autograph, as TensorFlow itself does from 2.18 on (its autograph config lists ``DoNotConvert('tf_keras')``).

TensorFlow 2.16 (the AzureML row) lists ``keras`` but not ``tf_keras``, so each process's first fit on tf_keras
converts ~700 of tf_keras' functions: about 17 s of CPU here (examples/train_cnn.py's first batch: 17 s, 0.4 s
without). What is tested does not change: the rule is TF 2.15's and TF 2.18's, and hvd-mlflow's own functions are
traced with ``autograph=False``. tests/conftest.py puts this folder first on ``PYTHONPATH`` for the processes the
session starts (Python imports ``sitecustomize`` at start-up) and applies the rule in the session's own process.
A script whose command sets ``PYTHONPATH`` itself (the AzureML job YAMLs' ``PYTHONPATH=.``) runs without it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

CONFIG = "tensorflow.python.autograph.core.config"
HERE = os.path.dirname(os.path.abspath(__file__))


def leave_tf_keras_unconverted(config: ModuleType | None = None) -> None:
    """Add TF 2.18's ``DoNotConvert('tf_keras')`` to autograph's rules where they lack it (idempotent)."""
    if config is None:
        from tensorflow.python.autograph.core import config
    if not any(isinstance(r, config.DoNotConvert) and r.matches("tf_keras.src") for r in config.CONVERSION_RULES):
        config.CONVERSION_RULES = (config.DoNotConvert("tf_keras"), *config.CONVERSION_RULES)


class _WhenConfigIsImported(importlib.abc.MetaPathFinder):
    """Applies the rule right after TensorFlow imports its autograph config (never imports TensorFlow itself)."""

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201 (importlib's protocol)
        if name != CONFIG:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            leave_tf_keras_unconverted(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if __name__ == "sitecustomize":  # at start-up; imported by its package name (tests/conftest.py), it only defines
    sys.meta_path.insert(0, _WhenConfigIsImported())
    # the interpreter's own sitecustomize, if it has one, still runs
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
