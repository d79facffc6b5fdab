from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from hvd_mlflow import _log
from hvd_mlflow.every_rank import divergence, metric_state, tracing

keras = tf.keras


class RunningMax(keras.metrics.Metric):
    def __init__(self, name="worst", **kwargs):
        super().__init__(name=name, **kwargs)
        self.value = self.add_weight(name="value", shape=(), initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.value.assign(tf.maximum(self.value, tf.reduce_max(tf.abs(tf.reshape(y_true, [-1]) -
                                                                      tf.reshape(y_pred, [-1])))))  # fmt: skip

    def result(self):
        return tf.identity(self.value)


class Counter(RunningMax):
    hvd_mlflow_additive = True


def traced(function: tracing.Traced, timeout: float = 60) -> bool:
    """Wait for a background trace to end; whether it is ready."""
    function._thread.join(timeout)
    return function.ready


def trained(metrics, jit_compile=False):
    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse", metrics=metrics, jit_compile=jit_compile)
    x = np.arange(16, dtype="float32").reshape(8, 2) / 10
    model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0)
    return model


def test_the_keys_of_a_non_additive_metric_are_found_and_the_state_is_restored():
    model = trained(["mae", RunningMax()])
    before = metric_state.capture(model, prefix="").values.copy()
    assert metric_state.inexact_keys(model) == {"worst"}
    assert metric_state.capture(model, prefix="").values.tolist() == before.tolist()


def test_a_declared_additive_metric_is_exact_and_builtins_are_additive():
    model = trained(["mae", Counter()])
    assert metric_state.inexact_keys(model) == set()
    assert all(metric_state.is_additive(m) for m in metric_state.leaf_metrics(model))


def test_compute_from_a_summed_state_is_the_metric_of_both_shards():
    model = trained(["mae"])
    state = metric_state.capture(model, prefix="val_")
    doubled = metric_state.capture(model, prefix="").compute(state.values * 2)  # two identical shards
    assert doubled["mae"] == float(np.asarray(model.get_metrics_result()["mae"]))  # twice the same shard: same mean
    assert "val_mae" in state.compute(state.values)


def test_an_epochs_training_and_validation_states_are_computed_together_each_with_its_prefix():
    """Two identical shards give each state's own metric: the truth is what Keras itself reported for each."""
    model = trained(["mae"])
    train = metric_state.capture(model, prefix="")
    train_truth = metric_state._results(model)  # Keras' own results for the training state
    x = np.linspace(-1, 1, 12, dtype="float32").reshape(6, 2)
    model.evaluate(x, x[:, :1] * 3, verbose=0)  # another state, as validation leaves it
    val = metric_state.capture(model, prefix="val_")
    val_truth = metric_state._results(model)
    assert train.source is val.source is not None and train_truth != val_truth
    together = metric_state.compute_all([train, val], [train.values * 2, val.values * 2])
    assert together[0].keys() == {"loss", "mae"} and together[1].keys() == {"val_loss", "val_mae"}
    for key in ("loss", "mae"):
        assert together[0][key] == pytest.approx(train_truth[key], rel=1e-6), key
        assert together[1][f"val_{key}"] == pytest.approx(val_truth[key], rel=1e-6), key


def test_the_compiled_computation_equals_the_eager_one_and_restores_the_state():
    model = trained(["mae", keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision")])
    state = metric_state.capture(model, prefix="")
    summed = state.values * 3 + 1  # any other state
    other = state.values * 2  # and a second one (an epoch's training and validation: one call for both)
    computer = metric_state._computer(model, metric_state._variables(model))
    for states in ([summed], [summed, other]):
        compiled = computer._call(computer._concrete(len(states)), states)
        assert len(compiled) == len(states)
        for values, results in zip(states, compiled, strict=True):
            [eager] = computer._run_eagerly([values], state.values)
            assert results.keys() == eager.keys() == {"loss", "mae", "auc", "precision"}
            for key in results:
                assert results[key] == pytest.approx(eager[key], rel=1e-6), key
        assert metric_state.capture(model, prefix="").values.tolist() == state.values.tolist()  # own state back
    assert compiled[0] != compiled[1]  # each state's own results, not the last one's twice
    assert sorted(computer._compiled) == [1, 2]  # traced once per number of states
    computer._call(computer._concrete(2), [other, summed])
    assert sorted(computer._compiled) == [1, 2]  # and not again
    assert not isinstance(metric_state.capture(model, prefix="")._values, np.ndarray)  # read by read ops (tensors)
    assert state.values.tolist() == computer._read_eagerly().tolist()  # every way alike
    assert state.samples == metric_state.samples(model) == 8  # the loss tracker's count, read from the state


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("then", ["trains", "validates"])
def test_a_snapshot_keeps_its_values_when_training_goes_on_before_it_is_made_flat(jit_compile, then):
    """A logged batch's state (and the training state kept before validation) is kept as eager tensors until its
    collective: later steps, compiled with XLA or not, and validation's reset must not change them (resource
    variables copy on write), in both Keras flavours' variables."""
    model = trained(["mae", keras.metrics.AUC(name="auc")], jit_compile=jit_compile)
    state = metric_state.capture(model, prefix="")
    assert not isinstance(state._values, np.ndarray)  # not made flat yet
    want = metric_state._computer(model, metric_state._variables(model))._read_eagerly()
    x = np.arange(16, dtype="float32").reshape(8, 2) / 7
    if then == "trains":
        model.train_on_batch(x, x[:, :1] + 1)  # the metrics move on (compiled updates of the same variables)
    else:
        model.evaluate(x[:4], x[:4, :1] + 1, verbose=0)  # reset, then updated with other samples
    now = metric_state.capture(model, prefix="").values
    assert now.tolist() != want.tolist()
    assert state.values.tolist() == want.tolist()  # the snapshot did not move with them
    assert state.samples == 8


def test_a_snapshot_whose_read_op_fails_reads_the_same_state_eagerly(monkeypatch):
    """A read op that fails on this rank alone (the snapshot's only way) gives the state read the other way: the
    same flat vector, so the collective's layout and values hold on every rank."""
    from tensorflow.python.ops import gen_resource_variable_ops

    model = trained(["mae", keras.metrics.AUC(name="auc")])
    want = metric_state._computer(model, metric_state._variables(model))._read_eagerly()

    real, failed = gen_resource_variable_ops.read_variable_op, []

    def fails_once(*args, **kwargs):  # the snapshot's first read fails; TensorFlow's own reads then work
        if not failed:
            failed.append(True)
            raise tf.errors.UnavailableError(None, None, "device gone")
        return real(*args, **kwargs)

    monkeypatch.setattr(gen_resource_variable_ops, "read_variable_op", fails_once)
    state = metric_state.capture(model, prefix="")
    assert isinstance(state._values, np.ndarray)  # read eagerly, flat, not as read ops' tensors
    assert failed and state.values.tolist() == want.tolist() and state.samples == 8


def test_a_state_that_cannot_be_read_at_all_sends_nan_of_its_size_instead_of_raising(monkeypatch, caplog):
    """Both reads fail on this rank alone (the read op, then TensorFlow's own reads): raising in the hook would leave
    the other ranks waiting in the collective, so NaN of the state's size (the eager read's), with a warning."""
    from tensorflow.python.ops import gen_resource_variable_ops

    model = trained(["mae", keras.metrics.AUC(name="auc")])
    size = metric_state._computer(model, metric_state._variables(model))._read_eagerly().size

    def fails(*args, **kwargs):
        raise tf.errors.UnavailableError(None, None, "device gone")

    monkeypatch.setattr(gen_resource_variable_ops, "read_variable_op", fails)
    monkeypatch.setattr(_log, "_said", set())  # its warning is said once per process
    state = metric_state.capture(model, prefix="")
    assert state.values.shape == (size,) and np.isnan(state.values).all()
    assert "device gone" in caplog.text


def test_a_snapshot_that_cannot_be_copied_out_sends_nan_of_its_size_instead_of_raising(monkeypatch, caplog):
    """Made flat on the way into a collective: raising there would be this rank alone, so NaN of the same size."""

    class LateDeviceError:
        shape = (2, 3)

        def __array__(self, dtype=None, copy=None):
            raise RuntimeError("device lost")

    monkeypatch.setattr(_log, "_said", set())  # its warning is said once per process
    state = metric_state.MetricState("", [np.ones(4), LateDeviceError()], None, lambda summed: {})
    assert state.values.shape == (10,) and np.isnan(state.values).all()
    assert "device lost" in caplog.text


class FailsOverALimit(RunningMax):
    """A metric whose result() fails at run time for a large state (a check inside a user's result())."""

    hvd_mlflow_additive = True

    def result(self):
        with tf.control_dependencies([tf.debugging.assert_less(self.value, 100.0, message="too large")]):
            return tf.identity(self.value)


def test_a_computation_that_fails_midway_leaves_the_own_state_in_place():
    model = trained(["mae", FailsOverALimit(name="checked")])
    own = metric_state.capture(model, prefix="")
    assert traced(metric_state.trace_in_background(model, states=1))  # the compiled form, as every rank has it later
    summed = own.values + 1000.0  # the compiled call puts it in, then result() fails
    with pytest.raises(tf.errors.InvalidArgumentError):
        metric_state.compute_all([own], [summed], compiled=True)  # fails compiled, then eagerly (alike everywhere)
    after = metric_state._computer(model, metric_state._variables(model))._read_eagerly()
    assert after.tolist() == own.values.tolist()  # the rank's own state, not the summed one


def test_an_epochs_results_and_the_fingerprint_run_eagerly_until_agreed_then_compiled_with_the_same_values():
    """No trace on the calling (training) thread for an epoch's results or the fingerprint: eager until their
    compiled forms, traced in a background thread, are agreed; the values do not change at the switch, so every rank,
    switching at the same epoch, writes the same values back into the logs."""
    model = trained(["mae", keras.metrics.AUC(name="auc")])
    state = metric_state.capture(model, prefix="")
    computer = metric_state._computer(model, metric_state._variables(model))
    train, val = state.values * 3 + 1, state.values * 2
    first = metric_state.compute_all([state, metric_state.capture(model, prefix="val_")], [train, val])
    fingerprint = divergence.fingerprint(model)
    assert computer._compiled == {} and computer.traced is None  # eager: nothing traced, nothing started
    assert divergence.fingerprint(model, compiled=True) == fingerprint  # agreed but not traced here: still eager
    assert divergence._FUNCTIONS[model].traced.concrete is None
    traces = [metric_state.trace_in_background(model, states=2), divergence.trace_in_background(model)]
    assert all(traced(t) for t in traces) and {t._thread.name for t in traces} == {"hvd-mlflow-trace"}
    eager_again = metric_state.compute_all([state, metric_state.capture(model, prefix="val_")], [train, val])
    calls = []
    traced_call = computer._call
    computer._call = lambda concrete, summed: calls.append(concrete) or traced_call(concrete, summed)
    again = metric_state.compute_all([state, metric_state.capture(model, prefix="val_")], [train, val], compiled=True)
    assert calls == [computer.traced.concrete[2]] and not computer.fell_back  # training and validation: one call
    alone = computer.many([val], compiled=True)[0]  # an epoch without validation: one state's call
    assert calls[1:] == [computer.traced.concrete[1]] and alone == {k[4:]: v for k, v in first[1].items()}
    assert divergence.fingerprint(model, compiled=True) == fingerprint
    assert again == first == eager_again and first[0]["auc"] != first[1]["val_auc"]
    assert computer._compiled == {}  # nothing traced on this thread
    assert metric_state.capture(model, prefix="").values.tolist() == state.values.tolist()  # own state back
    many = [state.values + i for i in range(3)]  # logged batches' states: compiled at once, as many calls as that
    assert [r["mae"] for r in computer.many(many)] == [r["mae"] for r in computer._run_eagerly(many, state.values)]
    assert sorted(computer._compiled) == [3]


def test_a_compiled_call_that_fails_here_computes_eagerly_and_is_carried_so_that_every_rank_follows():
    """A rank's own failure of a compiled call: that call's results eagerly (the same as the eager path's), the rank
    marked unhealthy (what it carries in the next collective), and once the agreement says so no compiled call."""
    model = trained(["mae", keras.metrics.AUC(name="auc")])
    state = metric_state.capture(model, prefix="")
    computer = metric_state._computer(model, metric_state._variables(model))
    many = [state.values + i for i in range(3)]  # logged batches' states: compiled from the first
    eager = computer._run_eagerly(many, state.values)
    assert metric_state.healthy(model)

    def fails(concrete, summed):
        raise MemoryError("injected")

    computer._call = fails
    assert computer.many(many) == eager and computer.fell_back and not metric_state.healthy(model)
    calls = []
    computer._call = lambda concrete, summed: calls.append(concrete)
    assert computer.many(many, compiled=True, healthy=False) == eager and calls == []  # agreed: eager everywhere
    assert tracing.Agreement.carry([_Ready()], metric_state.healthy(model))[tracing.HEALTHY_KEY] == 0.0


def test_every_rank_switches_to_compiled_at_the_same_epoch_once_all_are_ready():
    """The switch is decided from the epoch collective's sum of each rank's readiness: a rank whose trace is still
    running (a process that joined under elastic, a slower machine) keeps every rank eager; once all are ready,
    all switch together, and a new fit begins eagerly again on every rank."""
    size = 3
    agreement = tracing.Agreement()
    ready, not_ready = tracing.Agreement.carry([_Ready()]), tracing.Agreement.carry([_Ready(), None])
    ready_key, healthy_key = tracing.READY_KEY, tracing.HEALTHY_KEY
    assert ready == {ready_key: 1.0, healthy_key: 1.0} and not_ready == {ready_key: 0.0, healthy_key: 1.0}
    agreement.learn({ready_key: 2 * ready[ready_key] + not_ready[ready_key], healthy_key: 3.0}, size)
    assert not agreement.compiled
    agreement.learn({ready_key: 3.0, healthy_key: 3.0}, size)
    assert agreement.compiled
    agreement.learn({ready_key: 2.0, healthy_key: 3.0}, size)  # agreed once, for the rest of the fit
    assert agreement.compiled and not tracing.Agreement().compiled
    # one rank's compiled call failed: it carries it, and every rank computes eagerly from then on, never back
    failed = tracing.Agreement.carry([_Ready()], healthy=False)
    assert failed == {ready_key: 0.0, healthy_key: 0.0}
    agreement.learn({ready_key: 2.0, healthy_key: 2.0}, size)
    assert not agreement.compiled and not agreement.healthy
    agreement.learn({ready_key: 3.0, healthy_key: 3.0}, size)
    assert not agreement.compiled and not agreement.healthy


class _Ready:
    ready = True
