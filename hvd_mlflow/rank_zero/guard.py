"""Rank 0's guard: nothing that rank 0 alone does may raise out of a Keras hook.

When rank 0 is in a hook, every other rank is on its way to the next collective. If rank 0 raised there alone,
they would wait in that collective until the launcher kills the job. So every step that only rank 0 runs inside a
hook is written as::

    with self._rank0.step("learning rate"):
        extras["learning_rate"] = run_params.current_learning_rate(self.model)

An exception inside a step becomes one warning that names the step and says what is lost, and the logging
degrades instead of the training, one rung at a time:

1. the journal file cannot be written: the journal goes on in memory (:class:`hvd_mlflow.delivery.journal.LiveJournal`
   does this by itself, for the training thread and the sender alike);
2. a step that adds something to the run fails (params, the learning rate, the model, the CSV file): that is not
   logged, everything else is;
3. a step that logging cannot go on without fails (the destination, the journal in memory, the sender): logging
   is off for the rest of this ``fit``; what the journal file holds stays there for ``hvd-mlflow sync``.

The only exceptions that leave a hook are raised by every rank at the same point: ranks reporting different
metric keys or options, metric names that collide once cleaned (they are computed on every rank).

With ``HVD_MLFLOW_TESTING=1`` (the test suite sets it, as MLflow's suite sets ``MLFLOW_TESTING``) the guard
re-raises instead, so that a bug cannot hide behind a warning.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

from .._log import logger, one_line


class RankZeroGuard:
    """The guard of one callback's rank-0-only steps; ``logging_off`` is called when an essential step fails.

    Example::

        guard = RankZeroGuard(logging_off=callback._stop_logging)
        with guard.step("params"):
            run_logger.log_params(training_params(...))
        with guard.step("the sender", essential=True):
            run_logger.sender.start()
    """

    def __init__(self, logging_off: Callable[[], None]) -> None:
        self._logging_off = logging_off
        self._said: set[str] = set()  # one warning per step and error type, per fit

    @contextlib.contextmanager
    def step(self, name: str, *, essential: bool = False) -> Iterator[None]:
        try:
            yield
        except Exception as error:  # noqa: BLE001 - the point of the guard: rank 0 never raises alone
            if os.environ.get("HVD_MLFLOW_TESTING", "").strip().lower() in ("1", "true", "yes"):  # the test suite
                raise
            self._warn(name, error, essential)
            if essential:
                try:
                    self._logging_off()
                except Exception:  # noqa: BLE001 - logging is off either way
                    logger.debug("hvd-mlflow: turning logging off failed too", exc_info=True)

    def _warn(self, name: str, error: BaseException, essential: bool) -> None:
        key = f"{name}:{type(error).__name__}"
        if key in self._said:
            return
        self._said.add(key)
        detail = one_line(error)
        consequence = (
            "MLflow logging is off for the rest of this fit (what was journaled stays for hvd-mlflow sync)"
            if essential
            else "it is not logged; everything else is"
        )
        logger.warning("hvd-mlflow: %s failed on rank 0 (%s); %s. Training goes on.", name, detail, consequence)
        logger.debug("hvd-mlflow: %s failed on rank 0, whole:", name, exc_info=error)
