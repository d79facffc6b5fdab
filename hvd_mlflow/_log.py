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


_silenced = {"level": None}  # the level the user had before ``silent`` raised it


def set_silent(silent: bool) -> None:
    """With ``silent``, hvd-mlflow says nothing below ERROR. Without it, the logger's level is left as the user
    set it (``logging.getLogger("hvd_mlflow").setLevel(logging.DEBUG)`` keeps working), unless an earlier
    ``silent`` raised it: then it is put back."""
    with _said_lock:
        if silent and _silenced["level"] is None:
            _silenced["level"] = logger.level
            logger.setLevel(logging.ERROR)
        elif not silent and _silenced["level"] is not None:
            logger.setLevel(_silenced["level"])
            _silenced["level"] = None
