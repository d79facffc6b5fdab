"""Rank 0 ends, at process exit, a fit that never reached its end.

Keras calls no ``on_train_end`` when ``fit`` raises, in either flavour. Under :func:`hvd_mlflow.autolog` the wrapper
of ``fit`` ends it (FAILED); a ``HorovodMlflowCallback`` used without autolog has no such wrapper, and its run would
stay RUNNING, with the journal's last entries unsent (or no run at all, when the process exits in the first epoch).
So while a fit is open on rank 0 an ``atexit`` hook is registered (at train begin, again at every fit: a hook runs
before those registered earlier, Horovod's shutdown among them); the end of the fit cancels it. The hook holds the
callback weakly: it never keeps a callback, or its model, alive. A script that caught the error and kept no
reference lets the callback be collected: the hook then ends the run with the fit's run logger, which it holds.

It runs at a normal interpreter exit, an uncaught exception included; not when the process is killed (a signal's
default action, ``os._exit``): then the journal keeps everything for ``hvd-mlflow sync``.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 - see while_open
import weakref
from collections.abc import Callable

from .._log import logger


def while_open(end: Callable[[], None], orphaned: Callable[[], None]) -> Callable[[], None]:
    """Call the bound method ``end`` at process exit unless the function returned is called first (which cancels
    it). ``end``'s object is only weakly referenced: if it is gone by then, ``orphaned`` is called instead. What
    they raise is one warning.

    ``concurrent.futures.thread`` is imported with this module, while a fit runs: MLflow imports it, and once the
    interpreter is shutting down it cannot be imported (it registers a ``threading`` exit hook), so the sender's
    first MLflow import at exit (a fit cut in its first epoch) would fail."""
    method = weakref.WeakMethod(end)  # type: ignore[arg-type]

    def at_exit() -> None:
        bound = method()
        try:
            (bound or orphaned)()
        except Exception as error:  # noqa: BLE001 - the process is exiting: say it, never a traceback
            logger.warning("hvd-mlflow: could not end the open fit at exit: %s: %s", type(error).__name__, error)

    atexit.register(at_exit)
    return lambda: atexit.unregister(at_exit)
