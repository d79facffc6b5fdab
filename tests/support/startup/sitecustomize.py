"""Test speed only: a Python process the test session starts leaves tf_keras' own functions unconverted by
autograph, as TensorFlow itself does from 2.18 on (its autograph config lists ``DoNotConvert('tf_keras')``).

TensorFlow 2.16 (the AzureML row) lists ``keras`` but not ``tf_keras``, so each process's first fit on tf_keras
converts tf_keras' functions one by one: 10 s or more (docs/troubleshooting.md). The rule is the one TF 2.15 had for
Keras 2 and TF 2.18 has for tf_keras; hvd-mlflow's own functions are traced with ``autograph=False`` either way. What
it changes in a test: the user code tf_keras' train step calls (an optimizer's ``apply_gradients``, as in
examples/train_cnn.py) is traced without autograph's conversion, as on TF 2.15 and 2.18.

The test session (tests/conftest.py, :func:`for_session`) installs the rule in its own process and puts this folder
first on its ``PYTHONPATH``, so a process whose environment comes from the session's (tests/support/environment.py)
imports this module at start-up (Python's ``sitecustomize``), which installs it there. A command that sets
``PYTHONPATH`` itself (the AzureML job YAMLs' ``PYTHONPATH=.``, so the rehearsals: what AzureML's TF 2.16 users get)
runs without it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

CONFIG = "tensorflow.python.autograph.core.config"
HERE = os.path.dirname(os.path.abspath(__file__))


def for_session() -> None:
    """The test session's: the rule in its own process, and in each process it starts whose environment comes from
    its own (this folder first on ``PYTHONPATH``)."""
    install()
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if HERE not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([HERE, *paths])


def install() -> None:
    """The rule now if TensorFlow's autograph config is imported, else right after it is (never imports it)."""
    config = sys.modules.get(CONFIG)
    if config is not None:
        _leave_tf_keras_unconverted(config)
    # by name: the copy imported at start-up (sitecustomize) and tests/conftest.py's are two modules
    elif not any(type(finder).__name__ == _WhenConfigIsImported.__name__ for finder in sys.meta_path):
        sys.meta_path.insert(0, _WhenConfigIsImported())


def _leave_tf_keras_unconverted(config: ModuleType) -> None:
    """Add ``DoNotConvert('tf_keras')`` to autograph's rules where they lack it. Never raises: test speed only."""
    try:
        if not any(isinstance(r, config.DoNotConvert) and r.matches("tf_keras.src") for r in config.CONVERSION_RULES):
            config.CONVERSION_RULES = (config.DoNotConvert("tf_keras"), *config.CONVERSION_RULES)
    except Exception:  # noqa: BLE001 - a TensorFlow whose config differs: it converts as it would anyway
        pass


class _WhenConfigIsImported:
    """A ``sys.meta_path`` finder: applies the rule right after TensorFlow imports its autograph config."""

    def find_spec(self, name: str, path, target=None):  # noqa: ANN001, ANN201 (importlib's finder protocol)
        if name != CONFIG:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _leave_tf_keras_unconverted(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if __name__ == "sitecustomize":  # at start-up (imported as tests.support.startup.sitecustomize, it only defines)
    install()
    # the interpreter's own sitecustomize, if it has one, still runs
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
