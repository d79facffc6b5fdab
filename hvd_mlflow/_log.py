"""The package's logger, and warnings that are said once per reason."""

from __future__ import annotations

import logging
import re
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


# lines of a multi-line error message that locate it rather than say it: TensorFlow's node traces, stack frames
_LOCATING = re.compile(r"^(File \"|Detected at node|Traceback \(most recent call last\)|\[\[|\[Op:)")


def one_line(error: BaseException, limit: int = 300) -> str:
    """``error`` as one readable line, secrets masked: its type and message; of a message over several lines
    (TensorFlow's "Graph execution error" with its node trace), the first line and the last one that says something,
    never a stack frame. Log the whole error at debug level beside it (``logger.debug(..., exc_info=error)``).

    Example::

        one_line(error)  # 'InvalidArgumentError: Graph execution error: ... indices[1] = 7 is not in [0, 2)'
    """
    from .common.redact import redact

    try:
        raw = str(error)
    except Exception:  # noqa: BLE001 - an error whose str() fails is still named
        raw = ""
    kept: list[str] = []
    after_frame = False
    for line in raw.splitlines():
        text = line.strip()
        if after_frame and line[:1].isspace() and text:  # the source line under a stack frame
            after_frame = False
            continue
        after_frame = text.startswith('File "')
        if text and not _LOCATING.match(text):
            kept.append(text)
    message = kept[0] if kept else ""
    if len(kept) > 1:
        message = f"{message} ... {kept[-1]}"
    message = " ".join(redact(message).split())
    if len(message) > limit:
        message = message[: limit - 3] + "..."
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
