"""When hvd-mlflow traces its own TensorFlow functions: once they have paid for themselves.

Tracing one (the metric results from a summed state, the weights' fingerprint) costs 30-250 ms of Python on the
training thread; a call run eagerly costs 2-10 ms. Traced at its first call, it would add that to the end of the
first epoch, the one a short job feels, and pay back only after about twenty calls. So the first
:data:`TRACE_AFTER_CALLS` calls run eagerly and the next one traces. Eager and compiled calls give the same values
(the same kernels; tests/unit/test_metric_state.py), and the number of calls is the same on every rank (they are
made at the epoch ends and collectives every rank reaches alike), so every rank switches at the same call.

Example::

    calls = CallCount()
    result = compiled(state) if calls.trace_now() else eagerly(state)
"""

from __future__ import annotations

TRACE_AFTER_CALLS = 20  # the measured break-even: a 99-229 ms trace against 5-10 ms saved per call


class CallCount:
    """Counts the calls of one function; :meth:`trace_now` says whether this call may use (or trace) its compiled
    form."""

    def __init__(self) -> None:
        self.calls = 0

    def trace_now(self) -> bool:
        self.calls += 1
        return self.calls > TRACE_AFTER_CALLS
