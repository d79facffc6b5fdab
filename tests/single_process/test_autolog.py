"""autolog() in one process (no Horovod): patching, callback order, run life cycle, both Keras flavours."""

from __future__ import annotations

import importlib
import uuid

import mlflow
import numpy as np
import pytest

import hvd_mlflow
from hvd_mlflow.every_rank import keras_flavour
from tests.support.flavours import importable

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def tracking(mlflow_server, client, monkeypatch, tmp_path):
    """Each test logs into a fresh experiment of the session server; autolog is undone afterwards."""
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HVD_MLFLOW_JOURNAL_DIR", str(tmp_path / "journal"))
    name = f"autolog-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", name)
    mlflow.set_tracking_uri(mlflow_server.url)
    yield name
    hvd_mlflow.autolog(disable=True)
    mlflow.set_tracking_uri(None)


def runs_of(client, experiment_name):
    experiment = client.get_experiment_by_name(experiment_name)
    return client.search_runs([experiment.experiment_id]) if experiment else []


def small_model(flavour: str):
    keras = importlib.import_module(flavour)
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model, keras


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(32, 4)).astype("float32"), rng.normal(size=(32, 1)).astype("float32")


class Spy:
    """Records the callback list Keras builds for fit, and what each epoch logged locally."""

    def __init__(self, keras, monkeypatch):
        self.order: list[list[str]] = []
        original = keras.callbacks.CallbackList.on_train_begin

        def on_train_begin(cb_list, logs=None):
            self.order.append([type(cb).__name__ for cb in cb_list.callbacks])
            return original(cb_list, logs)

        monkeypatch.setattr(keras.callbacks.CallbackList, "on_train_begin", on_train_begin)


@pytest.mark.parametrize("flavour", importable())
def test_autolog_logs_every_epoch_once_with_callback_first(tracking, client, monkeypatch, flavour, tmp_path):
    model, keras = small_model(flavour)
    spy = Spy(keras, monkeypatch)
    hvd_mlflow.autolog()
    hvd_mlflow.autolog()  # twice: still one callback
    early = keras.callbacks.EarlyStopping(monitor="loss", patience=100)
    history = model.fit(*data(), epochs=3, batch_size=8, callbacks=[early], verbose=0)
    assert spy.order[0][:2] == ["HorovodMlflowCallback", "EarlyStopping"]
    assert spy.order[0].count("HorovodMlflowCallback") == 1
    [run] = runs_of(client, tracking)
    assert run.info.status == "FINISHED"
    assert not list((tmp_path / "journal").glob("*.sqlite"))  # delivered: the journal is removed
    points = client.get_metric_history(run.info.run_id, "loss")
    assert sorted((p.step, p.value) for p in points) == [
        (e, pytest.approx(v)) for e, v in enumerate(history.history["loss"])
    ]
    assert run.data.tags["hvd_mlflow.keras_flavour"] == flavour
    assert run.data.params["world_size"] == "1"


def test_disable_restores_fit(tracking):
    originals = {f: keras_flavour.model_class(f).fit for f in importable()}
    hvd_mlflow.autolog()
    assert all(keras_flavour.model_class(f).fit is not originals[f] for f in originals)
    hvd_mlflow.autolog(disable=True)
    assert all(keras_flavour.model_class(f).fit is originals[f] for f in originals)


def test_a_callback_the_user_passed_is_not_doubled(tracking, client, monkeypatch):
    flavour = keras_flavour.of_tf_keras()
    model, keras = small_model(flavour)
    spy = Spy(keras, monkeypatch)
    hvd_mlflow.autolog()
    model.fit(*data(), epochs=2, callbacks=[hvd_mlflow.HorovodMlflowCallback(model=model)], verbose=0)
    assert spy.order[0].count("HorovodMlflowCallback") == 1
    assert len(runs_of(client, tracking)) == 1


def test_a_failing_fit_ends_the_run_as_failed_and_keeps_what_was_logged(tracking, client):
    flavour = keras_flavour.of_tf_keras()
    model, keras = small_model(flavour)

    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("boom")

    hvd_mlflow.autolog()
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(*data(), epochs=5, callbacks=[Boom()], verbose=0)
    [run] = runs_of(client, tracking)
    assert run.info.status == "FAILED"
    assert [p.step for p in client.get_metric_history(run.info.run_id, "loss")] == [0, 1]


def test_user_run_is_used_and_left_open(tracking, client):
    flavour = keras_flavour.of_tf_keras()
    model, _ = small_model(flavour)
    hvd_mlflow.autolog()
    with mlflow.start_run() as run:
        model.fit(*data(), epochs=2, verbose=0)
        assert client.get_run(run.info.run_id).info.status == "RUNNING"
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 2
    assert len(runs_of(client, tracking)) == 1


def test_callback_logs_into_the_run_it_is_given(tracking, client):
    model, _ = small_model(keras_flavour.of_tf_keras())
    experiment = client.create_experiment(f"given-{uuid.uuid4().hex[:8]}")
    given = client.create_run(experiment).info.run_id
    callback = hvd_mlflow.HorovodMlflowCallback(model=model, run_id=given)
    model.fit(*data(), epochs=3, callbacks=[callback], verbose=0)
    assert callback.run_id == given
    assert [m.step for m in client.get_metric_history(given, "loss")] == [0, 1, 2]
    assert runs_of(client, tracking) == []  # no run created elsewhere
    assert client.get_run(given).info.status == "RUNNING"  # not created by hvd-mlflow: left open


def test_callback_of_the_wrong_flavour_is_refused_clearly():
    flavours = importable()
    if len(flavours) < 2:
        pytest.skip("only one Keras flavour is installed here")
    model, _ = small_model("tf_keras")
    callback = hvd_mlflow.HorovodMlflowCallback(flavour="keras")
    assert isinstance(callback, hvd_mlflow.HorovodMlflowCallback)
    with pytest.raises(TypeError, match="built for keras but the model is a tf_keras model"):
        callback.set_model(model)
    right = hvd_mlflow.HorovodMlflowCallback(model=model)
    assert isinstance(right, importlib.import_module("tf_keras").callbacks.Callback)


def custom_step_model(keras):
    """Keras' own custom ``train_step`` example: a loss tracker updated once per batch, without a sample weight."""
    import tensorflow as tf

    class Custom(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)
            self.loss_tracker = keras.metrics.Mean(name="loss")

        def call(self, x):
            return self.dense(x)

        def train_step(self, batch):
            x, y = batch
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

        @property
        def metrics(self):
            return [self.loss_tracker]

    model = Custom()
    model.compile(optimizer="sgd")
    return model


@pytest.mark.parametrize("flavour", importable())
def test_samples_per_s_counts_samples_or_is_not_logged(tracking, client, flavour, caplog):
    """samples_per_s x epoch_time_s is the epoch's 32 samples; a loss tracker that counts batches (4 per epoch here)
    gives no samples_per_s, with one warning, instead of batches per second."""
    import tensorflow as tf

    keras = importlib.import_module(flavour)
    hvd_mlflow.autolog()
    small_model(flavour)[0].fit(*data(), epochs=2, batch_size=8, verbose=0)
    small_model(flavour)[0].fit(tf.data.Dataset.from_tensor_slices(data()).batch(1), epochs=2, verbose=0)
    custom_step_model(keras).fit(*data(), epochs=2, batch_size=8, verbose=0)
    *standard, custom = sorted(runs_of(client, tracking), key=lambda run: run.info.start_time)
    for run in standard:  # batches of 8, then a dataset of batches of 1 (as many batches as samples)
        rate = {p.step: p.value for p in client.get_metric_history(run.info.run_id, "samples_per_s")}
        seconds = {p.step: p.value for p in client.get_metric_history(run.info.run_id, "epoch_time_s")}
        assert sorted(rate) == [0, 1] and all(rate[e] * seconds[e] == pytest.approx(32) for e in rate)
    assert "samples_per_s" not in client.get_run(custom.info.run_id).data.metrics
    assert "loss" in client.get_run(custom.info.run_id).data.metrics
    assert caplog.text.count("the loss tracker counts batches") == 1


def plain_wrapper(fit, calls: list[str]):
    """What experiment trackers and users' decorators install: a plain ``(self, *args, **kwargs)`` wrapper of fit,
    without functools.wraps (so nothing says what it wraps)."""

    def fit_wrapper(self, *args, **kwargs):
        calls.append("wrapper")
        return fit(self, *args, **kwargs)

    return fit_wrapper


@pytest.mark.parametrize("flavour", importable())
@pytest.mark.parametrize("installed", ["before autolog", "after autolog"])
@pytest.mark.parametrize("given", ["by keyword", "positionally"])
def test_a_plain_fit_wrapper_still_gets_the_callback(tracking, client, monkeypatch, flavour, installed, given):
    """Another tool's ``*args, **kwargs`` wrapper of Model.fit, installed before or after autolog(): the callback is
    still first in the list Keras runs, the run holds every epoch of the history, and the wrapper ran."""
    model, keras = small_model(flavour)
    spy = Spy(keras, monkeypatch)
    model_class, calls = keras_flavour.model_class(flavour), []
    if installed == "before autolog":
        monkeypatch.setattr(model_class, "fit", plain_wrapper(model_class.fit, calls))
    hvd_mlflow.autolog()
    if installed == "after autolog":  # on top of autolog's own: autolog(disable=True) (the fixture) restores fit
        model_class.fit = plain_wrapper(model_class.fit, calls)
    early = keras.callbacks.EarlyStopping(monitor="loss", patience=100)
    x, y = data()
    if given == "by keyword":
        history = model.fit(x, y, epochs=3, batch_size=8, callbacks=[early], verbose=0)
    else:  # fit(x, y, batch_size, epochs, verbose, callbacks, validation_split): Keras' documented order
        history = model.fit(x, y, 8, 3, 0, [early], 0.25)
    assert calls == ["wrapper"]
    assert spy.order == [["HorovodMlflowCallback", "EarlyStopping", "History"]]
    [run] = runs_of(client, tracking)
    assert run.info.status == "FINISHED"
    points = client.get_metric_history(run.info.run_id, "loss")
    assert sorted((p.step, p.value) for p in points) == [
        (e, pytest.approx(v)) for e, v in enumerate(history.history["loss"])
    ]
    assert run.data.params["batch_size"] == "8" and run.data.params["epochs"] == "3"
    assert ("val_loss" in run.data.metrics) == (given == "positionally")  # validation_split=0.25 reached Keras


@pytest.mark.parametrize("flavour", importable())
def test_a_fit_wrapper_that_cannot_take_callbacks_is_refused_before_training(tracking, client, monkeypatch, flavour):
    """A wrapper with neither a ``callbacks`` parameter nor ``**kwargs``: fit raises HvdMlflowError before Keras
    starts (no epoch, no run), saying why; with the user's own callback in the list it runs as usual."""
    model, keras = small_model(flavour)
    spy = Spy(keras, monkeypatch)
    model_class = keras_flavour.model_class(flavour)
    inner = model_class.fit

    def positional_only(self, *args):
        return inner(self, *args)

    monkeypatch.setattr(model_class, "fit", positional_only)
    hvd_mlflow.autolog()
    x, y = data()
    with pytest.raises(hvd_mlflow.HvdMlflowError, match="no parameter 'callbacks' and no \\*\\*kwargs"):
        model.fit(x, y, 8, 2, 0)
    assert spy.order == [] and runs_of(client, tracking) == []
    model.fit(x, y, 8, 2, 0, [hvd_mlflow.HorovodMlflowCallback(model=model)])
    assert spy.order == [["HorovodMlflowCallback", "History"]]
    [run] = runs_of(client, tracking)
    assert [p.step for p in client.get_metric_history(run.info.run_id, "loss")] == [0, 1]


def test_the_users_own_callback_under_autolog_ends_failed_when_fit_raises(tracking, client):
    """Under autolog, a HorovodMlflowCallback the user passed is ended by the wrapper when fit raises (Keras calls
    no on_train_end then), as autolog's own: FAILED at once, with the epochs that ended."""
    flavour = keras_flavour.of_tf_keras()
    model, keras = small_model(flavour)

    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("boom")

    hvd_mlflow.autolog()
    callback = hvd_mlflow.HorovodMlflowCallback(model=model)
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(*data(), epochs=5, callbacks=[callback, Boom()], verbose=0)
    [run] = runs_of(client, tracking)
    assert run.info.status == "FAILED" and callback.run_id == run.info.run_id
    assert [p.step for p in client.get_metric_history(run.info.run_id, "loss")] == [0, 1]


def test_a_fit_that_ended_leaves_no_exit_hook_behind(tracking, client, monkeypatch):
    """Rank 0's exit hook (rank_zero/exit_hook.py) lives while a fit is open: none is left after fits that ended,
    with the bare callback or under autolog; a bare callback's fit that raised keeps one, which ends it FAILED."""
    import types

    from hvd_mlflow.rank_zero import exit_hook

    hooks: list = []
    monkeypatch.setattr(exit_hook, "atexit", types.SimpleNamespace(register=hooks.append, unregister=hooks.remove))
    model, keras = small_model(keras_flavour.of_tf_keras())
    callback = hvd_mlflow.HorovodMlflowCallback(model=model)
    model.fit(*data(), epochs=1, callbacks=[callback], verbose=0)
    model.fit(*data(), epochs=1, callbacks=[callback], verbose=0)
    hvd_mlflow.autolog()
    model.fit(*data(), epochs=1, verbose=0)
    assert hooks == []

    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("boom")

    hvd_mlflow.autolog(disable=True)
    bare = hvd_mlflow.HorovodMlflowCallback(model=model)
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(*data(), epochs=2, callbacks=[bare, Boom()], verbose=0)
    [hook] = hooks
    hook()  # what runs at exit
    assert hooks == [] and client.get_run(bare.run_id).info.status == "FAILED"
    *ended, failed = sorted(runs_of(client, tracking), key=lambda run: run.info.start_time)
    assert failed.info.run_id == bare.run_id and ended and all(run.info.status == "FINISHED" for run in ended)
