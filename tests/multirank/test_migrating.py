"""The migration guide's learning-rate warm-up on two real Horovod ranks (docs/migrating.md, "Learning-rate warm-up").

The guide's recipe is run as the guide prints it (its code block, written to a file), in every row of the support
matrix, and the run's ``learning_rate`` history is checked against the ramp's formula, epoch by epoch. Horovod's own
``LearningRateWarmupCallback`` is run where the guide says it works (its formula, rising) and where it says it
fails (the error the guide quotes).
"""

from __future__ import annotations

import importlib.metadata
import uuid
from pathlib import Path

import pytest

from tests.docs.test_code_blocks import ROOT, blocks
from tests.support import launch

pytestmark = [pytest.mark.multirank, pytest.mark.shared, pytest.mark.oldest, pytest.mark.timeout(600)]

GUIDE = ROOT / "docs" / "migrating.md"
EPOCHS, WARMUP_EPOCHS, INITIAL_LR, SIZE = 5, 3, 0.1, 2  # the warm-up's initial_lr: the rate it ends at
SAMPLES, BATCH = 96, 16  # the fit worker's defaults: 6 steps per epoch
# Horovod 0.28.1's callbacks use the `keras` package's backend (`from keras import backend as K`), whatever tf.keras
# is: Keras 3's has no get_value (TF 2.16, in both Keras modes); Keras 2's has (TF 2.15).
KERAS_PACKAGE_MAJOR = int(importlib.metadata.version("keras").split(".")[0])


def guide_recipe(directory: Path) -> Path:
    """The guide's warm-up module, as the page prints it (the block the docs test writes to ``warmup.py``)."""
    (block,) = [b for b in blocks(GUIDE) if b.directive == "file=warmup.py"]
    path = directory / "warmup.py"
    path.write_text(block.code)
    return path


def fit_with_warmup(tmp_path: Path, mlflow_server, client, *args: str) -> tuple[launch.Launch, str]:
    run_id = client.create_run(client.create_experiment(f"warmup-{uuid.uuid4().hex[:8]}")).info.run_id
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_RUN_ID": run_id}
    warmup = ["--warmup-lr", str(INITIAL_LR), "--warmup-epochs", str(WARMUP_EPOCHS)]
    done = launch.run(tmp_path / "out", ["--epochs", str(EPOCHS), "--samples", str(SAMPLES), *warmup, *args], np=SIZE,
                      env=env)  # fmt: skip
    return done, run_id


def logged_rates(client, run_id: str) -> list[float]:
    history = sorted(client.get_metric_history(run_id, "learning_rate"), key=lambda m: m.step)
    assert [m.step for m in history] == list(range(EPOCHS))
    return [m.value for m in history]


def test_the_guides_warmup_recipe_logs_its_ramp_in_every_keras(tmp_path, mlflow_server, client):
    done, run_id = fit_with_warmup(tmp_path, mlflow_server, client, "--warmup-recipe", str(guide_recipe(tmp_path)))
    done.check()
    # the ramp: one rank's rate (initial_lr / size) in epoch 0, linearly up to initial_lr in epoch WARMUP_EPOCHS
    want = [INITIAL_LR / SIZE * (1 + min(e, WARMUP_EPOCHS) / WARMUP_EPOCHS * (SIZE - 1)) for e in range(EPOCHS)]
    assert want == pytest.approx([0.05, 0.1 / 2 * 4 / 3, 0.1 / 2 * 5 / 3, 0.1, 0.1])
    assert logged_rates(client, run_id) == pytest.approx(want, rel=1e-6)
    assert done.rank(1)["history"]["loss"] == pytest.approx(done.rank(0)["history"]["loss"], rel=1e-6)  # global


@pytest.mark.skipif(KERAS_PACKAGE_MAJOR >= 3, reason="Horovod's callback fails on TF 2.16 (Keras 3's backend): the "
                    "next test asserts that; it runs with TF 2.15's Keras 2")  # fmt: skip
@pytest.mark.parametrize("setting", [["--optimizer", "adam"], ["--optimizer", "sgd", "--no-momentum-correction"]],
                         ids=["adam", "sgd-without-momentum-correction"])  # fmt: skip
def test_horovods_warmup_callback_works_on_tf215_as_the_guide_says(tmp_path, mlflow_server, client, setting):
    done, run_id = fit_with_warmup(tmp_path, mlflow_server, client, "--horovod-warmup", *setting)
    done.check()
    # Horovod's ramp, per batch: initial_lr / size * ((epoch + (batch + 1) / steps) * (size - 1) / warmup + 1), set
    # before each batch of the warm-up epochs and kept after; the rate after epoch e is its last batch's
    want = [INITIAL_LR / SIZE * (1 + min(e + 1, WARMUP_EPOCHS) * (SIZE - 1) / WARMUP_EPOCHS) for e in range(EPOCHS)]
    rates = logged_rates(client, run_id)
    assert rates == pytest.approx(want, rel=1e-6)
    assert rates[0] < rates[1] < rates[2] == pytest.approx(INITIAL_LR)  # rising through the warm-up


@pytest.mark.parametrize(
    ("optimizer", "error"),
    [
        pytest.param(
            "adam",
            "has no attribute 'get_value'",  # module 'keras.api.backend' (Keras 3.3), 'keras.backend' (3.15)
            marks=pytest.mark.skipif(
                KERAS_PACKAGE_MAJOR < 3, reason="TF 2.15: it works with Adam, the test before asserts that"
            ),
        ),  # fmt: skip
        pytest.param(
            "sgd",
            "AttributeError: 'float' object has no attribute 'dtype'",
            marks=pytest.mark.skipif(
                KERAS_PACKAGE_MAJOR >= 3,
                reason="TF 2.16: it fails before it comes to the momentum, with any optimizer (the adam case)",
            ),
        ),  # fmt: skip
    ],
)
def test_horovods_warmup_callback_fails_where_the_guide_says(tmp_path, mlflow_server, client, optimizer, error):
    done, _ = fit_with_warmup(tmp_path, mlflow_server, client, "--horovod-warmup", "--optimizer", optimizer)
    assert done.returncode != 0
    assert error in done.output, done.output[-4000:]
    assert "horovod/_keras/callbacks.py" in done.output  # raised by Horovod's callback, not by hvd-mlflow
