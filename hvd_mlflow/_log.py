"""The package's logger, and warnings that are said once per reason."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("hvd_mlflow")

_said: set[str] = set()
_said_lock = threading.Lock()


def warn_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` as a warning the first time ``key`` is seen in this process."""
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    logger.warning(message, *args)


def set_silent(silent: bool) -> None:
    """With ``silent``, hvd-mlflow says nothing below ERROR."""
    logger.setLevel(logging.ERROR if silent else logging.NOTSET)
