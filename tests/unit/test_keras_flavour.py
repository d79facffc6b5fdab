from __future__ import annotations

import pytest

from hvd_mlflow.every_rank import keras_flavour
from tests.support.flavours import importable


@pytest.mark.parametrize("flavour", importable())
def test_a_model_knows_its_flavour_and_its_batch_hook_rhythm(flavour):
    import importlib

    keras = importlib.import_module(flavour)
    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=3)
    assert keras_flavour.of_model(model) == flavour
    assert keras_flavour.steps_per_execution(model) == 3
    assert keras_flavour.steps_per_execution_is_tuned(model) is False
    assert issubclass(keras_flavour.callback_base(flavour), keras.callbacks.Callback)


def test_not_a_keras_model_is_refused_clearly():
    with pytest.raises(TypeError, match="not a Keras model"):
        keras_flavour.of_model(object())


@pytest.mark.parametrize("setting", ["1", "0"])
def test_the_flavour_said_without_tensorflow_is_the_one_tensorflow_gives(setting):
    """The truth is TensorFlow itself: a fresh process with the setting imports it and asks tf.keras."""
    if setting == "1" and "tf_keras" not in importable():
        pytest.skip("TF 2.15 without tf_keras: TensorFlow itself cannot give tf.keras with TF_USE_LEGACY_KERAS=1")
    import os
    import subprocess
    import sys

    code = (
        "from hvd_mlflow.every_rank import keras_flavour; said = keras_flavour.of_tf_keras()\n"
        "import tensorflow as tf; print(said, tf.keras.Model.__module__.split('.', 1)[0])"
    )
    env = {**os.environ, "TF_USE_LEGACY_KERAS": setting, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    said, actual = done.stdout.split()[-2:]
    assert said == actual, done.stderr[-500:]


@pytest.mark.parametrize(("every", "asked"), [(0, False), (4, True)])
def test_tf_keras_is_asked_for_batch_callbacks_only_when_batches_are_logged(every, asked):
    """training-dynamics.md: with `log_every_n_steps` N = 0 hvd-mlflow does not ask tf_keras for batch callbacks
    at all; with N > 0 it does. The truth is tf_keras' own decision: the CallbackList its `fit` builds (verbose=0:
    with its History, without a progress bar) and whether a batch's end then reaches the callback."""
    if "tf_keras" not in importable():
        pytest.skip("no tf_keras here")
    import tf_keras

    from hvd_mlflow import HorovodMlflowCallback

    model = tf_keras.Sequential([tf_keras.Input(shape=(2,)), tf_keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    callback = HorovodMlflowCallback(model=model, log_every_n_steps=every)
    assert isinstance(callback, tf_keras.callbacks.Callback)
    callbacks = tf_keras.callbacks.CallbackList([callback], add_history=True, add_progbar=False, model=model,
                                                verbose=0, epochs=1, steps=8)  # fmt: skip
    assert callbacks._should_call_train_batch_hooks is asked
    reached = []
    callback.on_train_batch_end = lambda batch, logs=None: reached.append(batch)  # what tf_keras calls, if it does
    for batch in range(3):
        callbacks.on_train_batch_begin(batch)
        callbacks.on_train_batch_end(batch, {"loss": 1.0})
    assert reached == ([0, 1, 2] if asked else [])
