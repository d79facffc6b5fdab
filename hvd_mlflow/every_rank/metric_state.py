"""The state of a model's Keras metrics: read it, and compute results from a state summed over ranks.

For a Keras metric whose state is additive (the totals and counts of ``Mean``/``Sum`` and every
``MeanMetricWrapper`` such as the accuracies and losses, the confusion counts of ``AUC``, ``Precision``,
``Recall``, ``F1Score``, the confusion matrix of the IoU metrics, the sums of ``R2Score``), the result computed
from the element-wise sum of every rank's state is exactly the metric of all ranks' samples together. That is
what ``reduction="exact"`` logs. A metric whose ``update_state`` or ``result`` is user code may keep a state
that does not add up (a maximum, a running average): it is reported, and its value falls back to the
sample-weighted mean. Which result keys those are is found from what Keras reports (``get_metrics_result()``,
per output: Keras 3 names them ``<output>_<metric>``), by moving the non-additive metrics' state and seeing which
results move (:func:`inexact_keys`). A custom metric whose state does add up (a count, a sum) is declared so with
a class (or instance) attribute ``hvd_mlflow_additive = True``; ``False`` marks a built-in one as not additive.

Inside ``fit``, validation resets the metrics before ``on_epoch_end``, so the training state is captured when
validation begins (``on_test_begin``), and the validation state at ``on_epoch_end``.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .._log import warn_once
from . import replica_local
from .tracing import Traced


class MetricState:
    """One snapshot of all of a model's metric variables, and what they yield.

    ``values`` is the flat float64 concatenation of every variable; ``samples`` how many samples it covers (the
    loss tracker's count), used to weight the values of keys that cannot be computed exactly; ``compute`` maps a
    summed state to the result keys (with ``prefix``, e.g. ``val_``) of every additive metric. The snapshot is
    taken as eager tensors (one small read per variable: no compiled call to trace or run, no transfer) and made
    flat when it is first needed, in its collective: a logged batch's waits there for the next batch collective.
    """

    def __init__(
        self,
        prefix: str,
        values: np.ndarray | list[Any],
        samples: float | None,
        compute: Callable[[np.ndarray], dict[str, float]],
        source: _Computer | None = None,  # what read it: states of one source are computed together (compute_all)
    ) -> None:
        self.prefix, self.compute, self.source = prefix, compute, source
        self._values, self._samples = values, samples

    @property
    def values(self) -> np.ndarray:
        """The flat state. Made flat here, on the way into a collective: if a snapshot's tensors cannot be copied
        out now (an error a device reports late), this rank sends NaN of the same size, one warning, rather than
        raise alone while the others wait in the collective (the layout stays the same on every rank)."""
        if not isinstance(self._values, np.ndarray):
            try:
                self._values = _flat(self._values)
            except Exception as error:  # noqa: BLE001 - raised here, it would be on this rank alone
                self._values = _unread(error, sum(int(np.prod(t.shape, dtype=np.int64)) for t in self._values))
        return self._values

    @property
    def samples(self) -> float:
        if self._samples is None:
            self._samples = self.source.samples(self.values) if self.source is not None else 1.0
        return self._samples


def _unread(error: Exception, size: int) -> np.ndarray:
    """What a rank whose metric state cannot be read sends: NaN of the state's size, with one warning. Raised in a
    hook, the error would be this rank's alone while the others wait in the collective; NaN keeps the layout the
    same on every rank, and the epoch's values NaN on every rank alike."""
    warn_once("snapshot", "hvd-mlflow: a metric state could not be read (%s); its values are NaN", error)
    return np.full(size, np.nan)


def compute_all(
    states: list[MetricState], summed: list[np.ndarray], compiled: bool = False, healthy: bool = True
) -> list[dict[str, float]]:
    """Each state's results from its summed state: states read from the same metrics (an epoch's training and
    validation) together, others one by one; ``compiled`` and ``healthy``: agreed by every rank (:mod:`.tracing`)."""
    source = states[0].source if states else None
    if len(states) > 1 and source is not None and all(s.source is source for s in states):
        results = source.many(summed, compiled=compiled, healthy=healthy)
        return [{state.prefix + k: v for k, v in out.items()} for state, out in zip(states, results, strict=True)]
    return [_computed(state, values, compiled, healthy) for state, values in zip(states, summed, strict=True)]


def _computed(state: MetricState, summed: np.ndarray, compiled: bool, healthy: bool) -> dict[str, float]:
    if state.source is None:  # a state of some other origin: its own computation
        return state.compute(summed)
    return {state.prefix + k: v for k, v in state.source.many([summed], compiled, healthy)[0].items()}


def healthy(model: Any) -> bool:
    """Whether none of this rank's compiled calls for ``model`` failed (carried in the epoch collective)."""
    found = _COMPUTERS.get(model)
    return found is None or not found.fell_back


def leaf_metrics(model: Any) -> list[Any]:
    """The model's individual metrics (Keras 3 wraps compiled metrics in one ``CompileMetrics``)."""
    leaves = []
    for metric in getattr(model, "metrics", []):
        inner = getattr(metric, "metrics", None)
        if type(metric).__name__ == "CompileMetrics" and isinstance(inner, list):
            leaves.extend(inner)
        else:
            leaves.append(metric)
    return leaves


def _from_keras(method: Any) -> bool:
    return getattr(method, "__module__", "").split(".", 1)[0] in ("keras", "tf_keras")


ADDITIVE_ATTRIBUTE = "hvd_mlflow_additive"


def is_additive(metric: Any) -> bool:
    """Whether ``metric``'s state adds up over ranks: declared with ``hvd_mlflow_additive``, else whether it keeps
    the state of a built-in Keras metric (user code neither updates nor reads it)."""
    if not replica_local.adds_over_workers(metric):  # tf.distribute keeps its copies in step: each holds the total
        return False
    declared = getattr(metric, ADDITIVE_ATTRIBUTE, None)
    if declared is not None:
        return bool(declared)
    cls = type(metric)
    return _from_keras(cls.update_state) and _from_keras(cls.result) and _from_keras(cls.reset_state)


def non_additive_metrics(model: Any) -> list[Any]:
    return [m for m in leaf_metrics(model) if not is_additive(m)]


def inexact_keys(model: Any) -> set[str]:
    """The keys of ``get_metrics_result()`` computed from the state of a non-additive metric (whatever name Keras
    gives them, per output): their variables are set to three fixed probe states, and the results that move are
    theirs. The probes are the same on every rank (never this rank's own state), so every rank finds the same keys;
    the state is restored. If a probe cannot be computed, every key counts as inexact (on every rank alike)."""
    probed = {id(v) for m in non_additive_metrics(model) for v in m.variables}
    variables = _variables(model)
    if not probed or not hasattr(model, "get_metrics_result"):
        return set()
    computer = _computer(model, variables)
    own = computer._read_eagerly()
    probes = []
    for probe in range(3):
        state = own.copy()
        for index, (variable, (span, shape, dtype)) in enumerate(zip(variables, computer._layout, strict=True)):
            if id(variable) in probed:
                state[span] = _probe(np.zeros(shape, dtype), probe, index).ravel()
        probes.append(state)
    try:
        results = computer._run_eagerly(probes, own)
    except Exception:  # noqa: BLE001 - a user metric that cannot take the probe: weighted, everywhere alike
        try:
            return set(computer._run_eagerly([own], own)[0])
        except Exception:  # noqa: BLE001 - nor its own state: nothing to weigh either
            return set()
    return {k for k, v in results[0].items() if any(not _same(v, other.get(k)) for other in results[1:])}


def _probe(value: np.ndarray, probe: int, index: int) -> np.ndarray:
    """A state of ``value``'s shape and dtype that depends only on the probe and the variable's place."""
    if value.dtype == bool:
        return np.full(value.shape, probe % 2 == 0)
    ramp = np.arange(value.size, dtype=np.float64).reshape(value.shape) + index + 1
    return ((probe + 1) * ramp + probe).astype(value.dtype)


def _same(a: float, b: float | None) -> bool:
    return b is not None and (a == b or (np.isnan(a) and np.isnan(b)))


def _variables(model: Any) -> list[Any]:
    return [v for metric in getattr(model, "metrics", []) for v in metric.variables]


def _numpy(variable: Any) -> np.ndarray:
    return np.asarray(variable.numpy() if hasattr(variable, "numpy") else variable)


def _local(variable: Any) -> np.ndarray:
    """This rank's value of a metric variable: under tf.distribute its local copies added (no collective)."""
    return sum(_numpy(part) for part in replica_local.parts(variable))


def samples(model: Any) -> float:
    """How many samples the model's metrics cover now on this rank (the loss tracker's count), 1 if unknown."""
    count = _loss_count(model)
    return float(_local(count)) if count is not None else 1.0


def _loss_count(model: Any) -> Any:
    """The loss tracker's sample count variable (Keras' ``Mean`` named ``loss``), or ``None``."""
    return next((m.count for m in leaf_metrics(model) if m.name == "loss" and hasattr(m, "count")), None)


def capture(model: Any, prefix: str) -> MetricState | None:
    """The model's metric state now, or ``None`` when it has no metrics (or they are not built yet): kept as eager
    tensors, made flat when first needed (in its collective)."""
    variables = _variables(model)
    if not variables or not hasattr(model, "get_metrics_result"):
        return None
    computer = _computer(model, variables)
    flat = computer.snapshot()

    def compute(summed: np.ndarray) -> dict[str, float]:
        return {prefix + k: v for k, v in computer.many([summed])[0].items()}

    return MetricState(prefix, flat, None, compute, computer)


def trace_in_background(model: Any, states: int) -> Traced | None:
    """Start tracing the compiled form of an epoch's results for ``model``'s metrics off the training thread (see
    :mod:`hvd_mlflow.every_rank.tracing`), for epochs of ``states`` states (2: training and validation; one state's
    call serves every epoch); ``None`` when it has no metrics."""
    variables = _variables(model)
    if not variables or not hasattr(model, "get_metrics_result"):
        return None
    return _computer(model, variables).trace_in_background(together=states == 2)


_COMPUTERS: weakref.WeakKeyDictionary[Any, _Computer] = weakref.WeakKeyDictionary()


def _computer(model: Any, variables: list[Any]) -> _Computer:
    """The model's state reader and result computer, built once per set of metric variables (once per fit)."""
    found = _COMPUTERS.get(model)
    if found is None or [id(v) for v in found.variables] != [id(v) for v in variables]:
        found = _Computer(model, variables)
        _COMPUTERS[model] = found
    return found


EAGER_UP_TO_STATES = 2  # an epoch's training and validation state: more (logged batches) are compiled at once


class _Computer:
    """The metric state read eagerly, its results eagerly at first, then in compiled TensorFlow calls.

    :meth:`snapshot` reads every metric variable with one eager read op each. :meth:`many` (or a call with one
    state) puts each summed state in turn into the model's own metric variables, reads every result the way Keras
    names them and puts the variables back as they were: eagerly (4-14 ms per epoch on a model with an AUC, on these
    CPUs) until the compiled form of one state's call, traced in a background thread from the first epoch's end
    (:meth:`trace_in_background`), is ready on every rank (``compiled``: agreed,
    :mod:`hvd_mlflow.every_rank.tracing`); then one call per state (under 0.5 ms each). Calls of more states than
    :data:`EAGER_UP_TO_STATES` (logged batches, with ``log_every_n_steps``) are compiled from the first (eagerly
    each state would cost its 2-10 ms), traced once per number of states, on the training thread. The calls go to
    concrete functions, which skips TensorFlow's per-call signature matching. If one cannot be compiled (a metric
    whose code TensorFlow cannot trace), the same steps run eagerly.
    """

    def __init__(self, model: Any, variables: list[Any]) -> None:
        self._model = weakref.ref(model)  # never keeps a model alive (the cache is keyed by it)
        self._metrics = list(model.metrics)
        self.variables = list(variables)
        self._layout = _layout(variables)  # each variable's (span in the flat state, shape, dtype)
        count, spans = _loss_count(model), [span for span, _, _ in self._layout]  # the loss count:
        self._count_at = next((s.start for v, s in zip(variables, spans, strict=True) if v is count), None)  # its place
        self._compiled: dict[int, Any] = {}  # number of states (logged batches') -> concrete function
        self.traced: Traced | None = None  # {number of states: concrete function}, traced in the background
        self.fell_back = False  # a compiled call of results failed on this rank (carried: every rank then goes eager)
        self._last_read: np.ndarray | list[Any] | None = None  # the state as last read: a call follows a read, no step
        self._raw: list[Any] | None = None  # the TensorFlow variables behind the metric variables (eager assigns)
        # tf.distribute: this worker's copies are read, and results computed in replica context (replica_local.py)
        self._strategy = replica_local.strategy_of(self.variables)

    @functools.cached_property
    def _handles(self) -> list[list[tuple[Any, Any]]]:
        """Each variable's local copies that add up to its value (several under tf.distribute), as (handle, dtype)."""
        return [[(c.handle, c.dtype) for c in replica_local.parts(v)] for v in self.variables]

    def snapshot(self) -> list[Any] | np.ndarray:
        """This rank's state as one eager tensor per variable (one ``ReadVariableOp`` per local copy, the copies
        added: ~12 us against ~170 us for a compiled call and its transfer; ``value()`` would add as much again in
        Python). Every metric variable of tf_keras and of Keras 3 on TensorFlow, and their tf.distribute copies, is a
        resource variable: they copy on write, so later steps do not change the tensors; :func:`_flat` makes them
        one float64 vector. If a read fails here, the state read eagerly, flat (the same vector: the layout holds), and
        if that fails too, NaN of its size (:func:`_unread`)."""
        import tensorflow as tf
        from tensorflow.python.ops.gen_resource_variable_ops import read_variable_op

        try:
            tensors = [[read_variable_op(handle, dtype) for handle, dtype in copies] for copies in self._handles]
            self._last_read = [t[0] if len(t) == 1 else tf.add_n(t) for t in tensors]
        except Exception:  # noqa: BLE001 - read the other way: every way gives the same vector
            self._last_read = None  # (if that fails too)
            try:
                self._last_read = self._read_eagerly()
            except Exception as error:  # noqa: BLE001 - raised in a hook, it would be on this rank alone
                return _unread(error, self._layout[-1][0].stop)
        return self._last_read

    def samples(self, flat: np.ndarray) -> float:
        """How many samples ``flat`` covers (the loss tracker's count), 1 if unknown."""
        return float(flat[self._count_at]) if self._count_at is not None else 1.0

    def many(self, summed: list[np.ndarray], compiled: bool = False, healthy: bool = True) -> list[dict[str, float]]:
        """The results of each summed state (unprefixed), the variables left as they were. ``compiled``: every
        rank has its traced call, so this one may use it; ``healthy``: no rank's compiled call has failed, so logged
        batches' states may be computed compiled (both agreed in the epoch collective: :mod:`.tracing`)."""
        count = len(summed)
        if healthy:
            try:
                if count > EAGER_UP_TO_STATES:
                    return self._call(self._concrete(count), summed)
                if compiled and self.traced is not None and self.traced.ready:
                    together = self.traced.concrete.get(count)  # an epoch's training and validation: one call
                    if together is not None:
                        return self._call(together, summed)
                    return [self._call(self.traced.concrete[1], [state])[0] for state in summed]
            except Exception:  # noqa: BLE001 - this call eagerly, here; every rank eagerly from the next collective
                self.fell_back = True
        # restore the state as last read (the state the variables hold now, and held when a compiled call that failed
        # began, perhaps after putting the summed state in: a call always follows a read, with no step in between)
        saved = _flat(self._last_read) if self._last_read is not None else self._read_eagerly()
        return self._run_eagerly(summed, saved)

    def trace_in_background(self, together: bool) -> Traced:
        """Start tracing, off the training thread, one state's call and, if ``together``, the call of an epoch's
        training and validation states (once)."""
        if self.traced is None:
            self.traced = Traced(lambda: {count: self._trace(count) for count in ((1, 2) if together else (1,))})
            self.traced.start()
        return self.traced

    def _read_eagerly(self) -> np.ndarray:
        return np.concatenate([np.asarray(_local(v), dtype=np.float64).ravel() for v in self.variables])

    def _concrete(self, count: int) -> Any:
        """The concrete function of ``count`` states' call, traced on this thread at its first use."""
        if count not in self._compiled:
            self._compiled[count] = self._trace(count)
        return self._compiled[count]

    def _program(self, count: int) -> Callable[[Any], list[dict[str, Any]]]:
        """The call of ``count`` states as TensorFlow steps: put each in, read the results, put the own state back.
        Under tf.distribute it runs in replica context (:mod:`.replica_local`): each step on this worker's copies."""
        import tensorflow as tf

        layout, metrics = list(zip(self.variables, self._layout, strict=True)), self._metrics
        read, unwrapped = _reading(self.variables), self._strategy is not None

        def assign(flat: Any) -> list[Any]:
            return [v.assign(tf.cast(tf.reshape(flat[span], shape), dtype)) for v, (span, shape, dtype) in layout]

        def run(summed_states: Any) -> list[dict[str, Any]]:
            own_state = read()
            after: list[Any] = [own_state]
            out = []
            for index in range(count):  # unrolled: each state in turn, in order
                with tf.control_dependencies(after):
                    assigned = assign(summed_states[index])
                with tf.control_dependencies([summed_states, *[a for a in assigned if a is not None]]):
                    results = {k: tf.identity(v) for k, v in _symbolic_results(metrics, unwrapped).items()}
                after = list(results.values())
                out.append(results)
            with tf.control_dependencies(after):
                assign(own_state)
            return out

        if self._strategy is None:
            return run
        strategy = self._strategy
        return lambda summed_states: replica_local.in_replicas(strategy, run, summed_states)

    def _trace(self, count: int) -> Any:
        """The concrete function of :meth:`_program`."""
        import tensorflow as tf

        spec = tf.TensorSpec([count, self._layout[-1][0].stop if self._layout else 0], tf.float64)
        return tf.function(self._program(count), autograph=False).get_concrete_function(spec)

    @staticmethod
    def _call(concrete: Any, summed: list[np.ndarray]) -> list[dict[str, float]]:
        import tensorflow as tf

        out = concrete(tf.constant(np.stack(summed), tf.float64))
        return [{k: float(np.asarray(v).reshape(())) for k, v in results.items() if np.size(v) == 1} for results in out]

    def _run_eagerly(self, summed: list[np.ndarray], saved: np.ndarray) -> list[dict[str, float]]:
        """Each state in turn put in and its results read, then ``saved`` put back (once)."""
        if self._strategy is not None:  # in replica context: the program's own steps, run eagerly
            try:
                return self._call(self._program(len(summed)), summed)
            except Exception:
                self._restore_in_replicas(saved)
                raise
        model = self._model()
        try:
            out = []
            for state in summed:
                self._assign(state)
                out.append(_results(model))
            return out
        finally:
            self._assign(saved)

    def _restore_in_replicas(self, saved: np.ndarray) -> None:
        """Put ``saved`` (this worker's state) back into its first local copies after a failed call (tf.distribute)."""
        import tensorflow as tf

        def restore() -> None:
            for variable, (span, shape, dtype) in zip(self.variables, self._layout, strict=True):
                variable.assign(tf.constant(saved[span].reshape(shape), dtype))

        replica_local.in_replicas(self._strategy, restore)

    def _assign(self, flat: np.ndarray) -> None:
        """Put ``flat`` into the variables, eagerly (through TensorFlow's own variables: a third of the time of Keras
        3's wrappers)."""
        if self._raw is None:
            self._raw = [replica_local.tf_variable(v) for v in self.variables]
        for variable, (span, shape, dtype) in zip(self._raw, self._layout, strict=True):
            variable.assign(flat[span].reshape(shape).astype(dtype), read_value=False)


def _dtype_name(variable: Any) -> str:
    dtype = variable.dtype
    return getattr(dtype, "name", None) or str(dtype)  # tf.DType (tf_keras) or a string (Keras 3)


def spans(sizes: Iterable[int], start: int = 0) -> list[slice]:
    """The slices of consecutive pieces of ``sizes`` in a flat vector, the first at ``start``."""
    ends = (start + np.cumsum([0, *sizes], dtype=np.int64)).tolist()
    return [slice(a, b) for a, b in zip(ends[:-1], ends[1:], strict=True)]


def _layout(variables: list[Any]) -> list[tuple[slice, tuple[int, ...], str]]:
    """Each variable's place in the flat state (a slice), shape and dtype name."""
    places = spans(int(np.prod(tuple(v.shape), dtype=np.int64)) for v in variables)
    return [(place, tuple(v.shape), _dtype_name(v)) for place, v in zip(places, variables, strict=True)]


def _reading(variables: list[Any]) -> Callable[[], Any]:
    """A function reading ``variables`` into one flat float64 tensor (inside a compiled function)."""
    import tensorflow as tf

    def read() -> Any:
        return tf.concat([tf.reshape(tf.cast(tf.convert_to_tensor(v), tf.float64), [-1]) for v in variables], 0)

    return read


def _flat(values: np.ndarray | list[Any]) -> np.ndarray:
    """A state as one flat float64 vector (a snapshot's tensors, or an already flat vector)."""
    if isinstance(values, np.ndarray):
        return values
    return np.concatenate([np.asarray(t, dtype=np.float64).ravel() for t in values])


def _symbolic_results(metrics: list[Any], unwrapped: bool = False) -> dict[str, Any]:
    """What ``model.get_metrics_result()`` returns for the model's ``metrics``, as tensors (both Keras flavours
    name results this way; their own method then converts them to Python numbers, which a compiled function
    cannot). ``unwrapped``: each metric's own ``result`` (under tf.distribute: this replica's, no collective)."""
    out: dict[str, Any] = {}
    for metric in metrics:
        result = replica_local.result(metric) if unwrapped else metric.result()
        if isinstance(result, dict):
            out.update(result)
        else:
            out[metric.name] = result
    return out


def _results(model: Any) -> dict[str, float]:
    out = {}
    for key, value in model.get_metrics_result().items():
        number = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        if number.size == 1:
            out[key] = float(number.reshape(()))
    return out
