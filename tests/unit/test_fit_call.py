"""Reading a fit call and passing callbacks on through wrappers of Keras' fit (stand-in classes, no Keras)."""

from __future__ import annotations

import functools

import pytest

from hvd_mlflow.every_rank import fit_call


class Trainer:
    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, validation_split=0.0):
        return {"x": x, "y": y, "batch_size": batch_size, "epochs": epochs, "callbacks": callbacks,
                "validation_split": validation_split}  # fmt: skip


class Model(Trainer):
    pass


def plain(fit):
    def wrapper(self, *args, **kwargs):
        return fit(self, *args, **kwargs)

    return wrapper


def call(plan_of, *args, **kwargs):
    plan = fit_call.FitCall(plan_of, Model)
    bound = plan.bind("model", args, kwargs)
    return plan, bound


def test_keras_signature_is_found_behind_wrappers_else_in_the_mro_else_documented():
    keeps = functools.wraps(Trainer.fit)(plain(Trainer.fit))  # functools.wraps: __wrapped__ leads to it
    assert list(fit_call.keras_signature(keeps, Model).parameters)[-1] == "validation_split"
    assert list(fit_call.keras_signature(plain(Trainer.fit), Model).parameters)[-1] == "validation_split"  # MRO
    documented = fit_call.keras_signature(plain(Trainer.fit), object)
    assert [n for n, _ in fit_call.DOCUMENTED_ORDER][:6] == ["x", "y", "batch_size", "epochs", "verbose", "callbacks"]
    assert list(documented.parameters)[1:] == [n for n, _ in fit_call.DOCUMENTED_ORDER]


def test_keras_fit_itself_gets_its_callbacks_as_the_parameter():
    plan, bound = call(Trainer.fit, 1, 2, 8, callbacks=["theirs"])
    assert plan.passes == "parameter" and bound.arguments["callbacks"] == ["theirs"]
    args, kwargs = bound.with_callbacks(["mine", "theirs"])
    assert Trainer.fit(*args, **kwargs)["callbacks"] == ["mine", "theirs"]


@pytest.mark.parametrize("given", ["keyword", "positional"])
def test_a_plain_wrapper_gets_them_by_keyword_with_every_later_positional_argument(given):
    wrapper = plain(Trainer.fit)
    if given == "keyword":
        plan, bound = call(wrapper, 1, 2, batch_size=8, epochs=3, callbacks=["theirs"])
    else:
        plan, bound = call(wrapper, 1, 2, 8, 3, 0, ["theirs"], 0.25)
    assert plan.passes == "keyword"
    read = bound.arguments
    assert (read["batch_size"], read["epochs"], read["callbacks"]) == (8, 3, ["theirs"])
    args, kwargs = bound.with_callbacks(["mine", "theirs"])
    assert "callbacks" in kwargs and len(args) <= 1 + 5  # the model, then at most x .. verbose positionally
    got = wrapper(*args, **kwargs)
    assert (got["x"], got["y"], got["batch_size"], got["epochs"], got["callbacks"]) == (1, 2, 8, 3, ["mine", "theirs"])
    assert got["validation_split"] == (0.25 if given == "positional" else 0.0)


def test_a_wrapper_without_callbacks_or_kwargs_cannot_be_given_them():
    def positional_only(self, *args):
        return Trainer.fit(self, *args)

    plan, bound = call(positional_only, 1, 2, 8, 3, 0, ["theirs"])
    assert plan.passes == "none" and bound.arguments["callbacks"] == ["theirs"]  # the user's own are still seen
    with pytest.raises(fit_call.CannotPass, match="no parameter 'callbacks' and no \\*\\*kwargs"):
        bound.with_callbacks(["mine"])
