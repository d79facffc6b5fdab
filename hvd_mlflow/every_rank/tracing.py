"""When hvd-mlflow traces its own TensorFlow functions: once they have paid for themselves.

Tracing one (the metric results from a summed state: 99-229 ms measured; the weights' fingerprint: 29-41 ms) costs
Python on the training thread; a call run eagerly costs 2-10 ms. Traced at its first call, it would add that to
the end of the first epoch, the one a short job feels, and pay back only after about twenty calls. So in each
``fit`` the first :data:`TRACE_AFTER_CALLS` calls run eagerly and the next ones use (or trace) the compiled form.
Eager and compiled calls give the same values (the same kernels; tests/unit/test_metric_state.py), and every rank
switches at the same call by construction: the counts start again at every train begin (:func:`new_fit`, called
on every rank, also by a process that joins under Horovod elastic), and the calls are made at the epoch ends and
collectives every rank reaches alike.

Example::

    calls = CallCount()
    result = compiled(state) if calls.trace_now() else eagerly(state)
"""

from __future__ import annotations

TRACE_AFTER_CALLS = 20  # the measured break-even: a 99-229 ms trace against 5-10 ms saved per call


_fit = 0  # which fit of this process the counts belong to


def new_fit() -> None:
    """A ``fit`` begins (on every rank, at train begin): every count starts again."""
    global _fit
    _fit += 1


class CallCount:
    """Counts the calls of one function in this fit; :meth:`trace_now` says whether this call may use (or trace) its
    compiled form."""

    def __init__(self) -> None:
        self.calls, self._fit = 0, _fit

    def trace_now(self) -> bool:
        if self._fit != _fit:
            self.calls, self._fit = 0, _fit
        self.calls += 1
        return self.calls > TRACE_AFTER_CALLS
