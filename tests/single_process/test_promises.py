"""Tests of promises in README.md and docs/ that no other test asserted; each test names the docs lines it holds to.

Every value is checked against an independent truth: what Keras itself reports (its history, its optimizer, a callback
of the test's own) and what the session's real ``mlflow server`` holds.
"""

from __future__ import annotations

import csv
import importlib
import logging
import types
import uuid

import numpy as np
import pytest

import hvd_mlflow
from hvd_mlflow.every_rank import keras_flavour
from tests.single_process.test_autolog import data, runs_of, small_model, tracking  # noqa: F401 - registers it
from tests.support.flavours import importable

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def experiment(request) -> str:
    """test_autolog's ``tracking``: a fresh experiment of the session's server (its name), autolog undone after."""
    return request.getfixturevalue("tracking")


def test_a_bare_callbacks_fit_that_raised_is_ended_failed_when_its_next_fit_begins(experiment, client, monkeypatch):
    """README.md:120, docs/reference.md:95-96 ("ended `FAILED` when its next `fit` begins"): without autolog, Keras
    calls no on_train_end when fit raises; the callback's next fit ends that run FAILED as it begins (in the process,
    not by the exit hook)."""
    from hvd_mlflow.rank_zero import exit_hook

    hooks: list = []  # the exit hook is recorded here, never run: only the next fit can end the run
    monkeypatch.setattr(exit_hook, "atexit", types.SimpleNamespace(register=hooks.append, unregister=hooks.remove))
    model, keras = small_model(keras_flavour.of_tf_keras())

    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("boom")

    class Probe(keras.callbacks.Callback):
        """At the next fit's train begin (after the callback's own, which runs first), what the server holds."""

        statuses: list[list[str]] = []

        def on_train_begin(self, logs=None):
            self.statuses.append([run.info.status for run in runs_of(client, experiment)])

    callback = hvd_mlflow.HorovodMlflowCallback(model=model)
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(*data(), epochs=4, callbacks=[callback, Boom()], verbose=0)
    assert len(hooks) == 1  # the cut fit is still open: nothing has ended it yet
    model.fit(*data(), epochs=2, callbacks=[callback, Probe()], verbose=0)
    assert Probe.statuses == [["FAILED"]]  # ended as the next fit began, before its first epoch
    failed, finished = sorted(runs_of(client, experiment), key=lambda run: run.info.start_time)
    assert failed.info.status == "FAILED" and finished.info.status == "FINISHED"
    assert [p.step for p in client.get_metric_history(failed.info.run_id, "loss")] == [0, 1]
    assert hooks == []  # no exit hook left: not the one that ended it


def learning_rate_recorder(keras):
    """A callback of the test's own: the optimizer's rate at each epoch's begin (the one the epoch trains with)."""

    class Rates(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.rates: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.rates.append(float(np.asarray(self.model.optimizer.learning_rate)))

    return Rates()


@pytest.mark.parametrize("flavour", importable())
def test_logged_learning_rate_follows_reduce_lr_on_plateau(experiment, client, flavour):
    """README.md:134, docs/reference.md:164, docs/training-dynamics.md:10 ("`ReduceLROnPlateau` included"): the
    learning_rate logged each epoch is the optimizer's. A min_delta no loss can beat makes every epoch after the first
    a plateau: with patience=0 the rate halves after each of them."""
    keras = importlib.import_module(flavour)
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse")
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=1e6, verbose=0)
    truth = learning_rate_recorder(keras)
    callbacks = [hvd_mlflow.HorovodMlflowCallback(model=model), plateau, truth]
    model.fit(*data(), epochs=4, batch_size=8, callbacks=callbacks, verbose=0)
    assert truth.rates == pytest.approx([0.1, 0.1, 0.05, 0.025])  # the premise: ReduceLROnPlateau did change it
    [run] = runs_of(client, experiment)
    logged = sorted((p.step, p.value) for p in client.get_metric_history(run.info.run_id, "learning_rate"))
    assert logged == [(epoch, pytest.approx(rate)) for epoch, rate in enumerate(truth.rates)]


def csv_rows(path):
    with open(path, newline="") as file:
        return list(csv.reader(file))


@pytest.mark.parametrize("flavour", importable())
@pytest.mark.parametrize("resumed_by", ["the same callback", "a new callback"])
def test_csv_path_appends_when_fit_resumes(experiment, client, tmp_path, flavour, resumed_by):
    """docs/reference.md:67 ("appending when `fit` resumes"): csv_path writes with Keras' CSVLogger; two epochs, then a
    fit with initial_epoch=2 up to epoch 4 give one header and the rows of epochs 0 to 3, each the epoch's loss."""
    model, _ = small_model(flavour)
    path = tmp_path / "metrics.csv"
    callback = hvd_mlflow.HorovodMlflowCallback(model=model, csv_path=str(path))
    first = model.fit(*data(), epochs=2, batch_size=8, callbacks=[callback], verbose=0)
    if resumed_by == "a new callback":
        callback = hvd_mlflow.HorovodMlflowCallback(model=model, csv_path=str(path))
    second = model.fit(*data(), initial_epoch=2, epochs=4, batch_size=8, callbacks=[callback], verbose=0)
    header, *rows = csv_rows(path)
    assert header[0] == "epoch" and "loss" in header
    assert [int(row[0]) for row in rows] == [0, 1, 2, 3]  # one header: no row repeats it
    losses = [float(row[header.index("loss")]) for row in rows]
    assert losses == pytest.approx(first.history["loss"] + second.history["loss"])


@pytest.fixture
def loudness_restored():
    from hvd_mlflow._log import set_silent

    yield
    set_silent(False)  # a test that failed half-way must not silence the tests after it


def hvd_mlflow_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("hvd_mlflow") and r.levelno >= logging.WARNING]


def test_silent_says_no_warning_and_without_it_the_warning_is_there(
    experiment, client, caplog, capfd, loudness_restored
):
    """docs/reference.md:61 ("no warnings from hvd-mlflow"): a metric name MLflow does not accept (``mse@...``) is
    logged cleaned (``mse_...``) with one warning (docs/reference.md:163): with silent=True none, neither on the log
    records nor on stderr; without it, the warning."""
    keras = importlib.import_module(keras_flavour.of_tf_keras())
    token = uuid.uuid4().hex[:8]  # each name warns once per process: names of this test alone
    for silent in (True, False):
        name = f"mse@{'silent' if silent else 'loud'}{token}"
        model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", metrics=[keras.metrics.MeanSquaredError(name=name)])
        caplog.clear()
        capfd.readouterr()
        callbacks = [hvd_mlflow.HorovodMlflowCallback(model=model, silent=silent)]
        history = model.fit(*data(), epochs=2, batch_size=8, callbacks=callbacks, verbose=0)
        assert name in history.history  # Keras logged it under the name MLflow refuses
        said = hvd_mlflow_warnings(caplog)
        if silent:
            assert said == [] and "hvd-mlflow" not in capfd.readouterr().err
        else:
            assert [m for m in said if repr(name) in m] == [
                f"hvd-mlflow: metric name {name!r} is not accepted by MLflow/AzureML; it is logged as "
                f"{name.replace('@', '_')!r}"
            ]
    silent_run, loud_run = sorted(runs_of(client, experiment), key=lambda run: run.info.start_time)
    for run, word in ((silent_run, "silent"), (loud_run, "loud")):  # both logged it, cleaned: the warning's case
        assert [p.step for p in client.get_metric_history(run.info.run_id, f"mse_{word}{token}")] == [0, 1]
