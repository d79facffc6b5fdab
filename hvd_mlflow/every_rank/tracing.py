"""When hvd-mlflow's own TensorFlow functions run compiled: once every rank has traced them, off the training thread.

hvd-mlflow computes an epoch's metric results from a summed state, and the weights' fingerprint, on every rank at
every epoch end. Compiled, a call costs under a millisecond; eagerly, 4-14 ms (measured on the realistic bench
model: 2-3% of a half-second epoch). But tracing one costs 70-400 ms of Python: at the first epoch's end it would
delay the start-up a short job feels, and on the training thread at any epoch end it would stall every rank.

So each such function is traced in a background thread (:class:`Traced`), started at the end of the first epoch,
while the training thread mostly waits in TensorFlow with the GIL released (measured: the epoch it overlaps ends no
later). Until it is ready, the calls run eagerly. Eager and compiled calls give the same values (the same kernels;
tests/unit/test_metric_state.py), and every rank writes those values back into Keras' logs, so every rank must
switch at the same epoch: each rank carries whether its functions are ready in the epoch's collective
(:data:`READY_KEY`), and the first collective whose sum says all were ready switches every rank (:class:`Agreement`,
learned by :class:`~hvd_mlflow.every_rank.aggregate.Reducer` before it computes that collective's results; the
weights' fingerprint, computed before the collective, follows from the next epoch). A process that joins under
Horovod elastic reports "not ready" until its own trace is done: everyone waits for it, eagerly. A trace that fails
leaves its rank eager, and so every rank. A compiled call that fails on one rank (a rank's own trouble: memory, a
thread) makes that call eager there alone, its values equal to the others' within float32 rounding, not bit for bit;
the rank then carries it (:data:`HEALTHY_KEY`), and from the next collective every rank computes eagerly, for the
rest of the fit: no rank keeps a path of its own.

Example::

    traced = Traced(lambda: tf.function(run).get_concrete_function(spec))
    traced.start()                          # at the first epoch's end, on every rank
    result = traced.concrete(x) if agreement.compiled and traced.ready else eagerly(x)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

READY_KEY = "compiled_ready"  # what each rank carries in the epoch's collective: 1.0 when its functions are traced
HEALTHY_KEY = "compiled_healthy"  # and 1.0 while none of its compiled calls has failed


class Traced:
    """One function, traced once in a thread of its own; :attr:`ready` once its concrete function exists."""

    def __init__(self, trace: Callable[[], Any]) -> None:
        self._trace = trace
        self._thread: threading.Thread | None = None
        self.concrete: Any = None

    def start(self) -> None:
        """Begin tracing (once; later calls do nothing).

        Not a daemon thread: the interpreter waits for it at exit (a trace takes well under a second). A daemon
        thread still inside TensorFlow's tracing when the process ends aborts it (``terminate called after throwing
        an instance of '%'``, signal 6): seen when a short fit ends as the trace of its first epoch end runs."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hvd-mlflow-trace", daemon=False)
            self._thread.start()

    def _run(self) -> None:
        try:
            self.concrete = self._trace()
        except Exception:  # noqa: BLE001 - a function TensorFlow cannot trace stays eager (on every rank: agreed)
            return

    @property
    def ready(self) -> bool:
        return self.concrete is not None


class Agreement:
    """Whether this fit's epoch ends run compiled, agreed in the epoch collectives (the same on every rank)."""

    def __init__(self) -> None:
        self.compiled = False  # a fit begins eagerly on every rank
        self.healthy = True  # no rank's compiled call has failed: compiled calls may be made (logged batches')

    @staticmethod
    def carry(functions: Iterable[Traced | None] | None, healthy: bool = True) -> dict[str, float]:
        """This rank's share: ready when every function it will call is traced, healthy while none of its compiled
        calls failed."""
        ready = functions is not None and all(f is not None and f.ready for f in functions)
        return {READY_KEY: 1.0 if ready and healthy else 0.0, HEALTHY_KEY: 1.0 if healthy else 0.0}

    def learn(self, carried: dict[str, float], size: int) -> None:
        """After an epoch's collective: compiled once every rank was ready, until any rank's compiled call failed
        (then eagerly on every rank, never back)."""
        self.healthy = self.healthy and carried.get(HEALTHY_KEY, float(size)) == size
        self.compiled = self.healthy and (self.compiled or carried.get(READY_KEY, 0.0) == size)
