from __future__ import annotations

import pytest

from hvd_mlflow import keras_flavour


@pytest.mark.parametrize("flavour", keras_flavour.importable())
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


@pytest.mark.parametrize(
    ("setting", "expected"), [("1", "tf_keras"), ("true", "tf_keras"), ("0", "keras"), ("", "keras")]
)
def test_tf_keras_resolves_from_the_one_reading_of_tf_use_legacy_keras(monkeypatch, setting, expected):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", setting)
    assert keras_flavour.legacy_setting() == setting
    if expected == "tf_keras" and "tf_keras" not in keras_flavour.importable():
        expected = "keras"  # TF 2.15: no tf_keras package, tf.keras stays Keras 2
    assert keras_flavour.of_tf_keras() == expected
