"""Two fits of one model with ``log_models`` on, the second changing the weights (tests/multirank/test_model_upload.py).

Writes ``rank0.json`` into ``--out``: after each fit returned, the threads alive (names), hvd-mlflow's warnings so
far, how long the end of the fit took (Keras' train-end callbacks until ``fit`` returned), and the model's predictions
on 4 probe inputs as they were right then (the truth the logged model, or its saved copy, is compared with).
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from pathlib import Path

import common
import horovod.tensorflow as hvd
import mlflow  # noqa: F401  (imported before fit, as a script that logs models does)
import numpy as np

import hvd_mlflow

keras = common.keras


class Warnings(logging.Handler):
    """hvd-mlflow's warnings, in order."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class TrainEnd(keras.callbacks.Callback):
    """When Keras' train-end callbacks began (autolog ends the fit after them)."""

    def on_train_end(self, logs=None):
        self.at = time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    hvd.init()
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s: %(message)s")
    warnings = Warnings()
    logging.getLogger("hvd_mlflow").addHandler(warnings)
    hvd_mlflow.autolog()
    model = common.small_model()
    x, y = common.data(0, 64)
    probe = common.data(0, 4, seed=99)[0]
    record: dict = {"flavour": common.FLAVOUR, "probe_x": probe.tolist()}
    for fit in (1, 2):
        if fit == 2:  # the script goes on with the model: its weights change at once, then it trains again
            model.set_weights([w + 0.5 for w in model.get_weights()])
        end = TrainEnd()
        model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[end])
        record[f"fit{fit}"] = {
            "end_s": time.monotonic() - end.at,
            "threads": sorted(t.name for t in threading.enumerate()),
            "warnings": list(warnings.messages),
            "probe_y": np.asarray(model.predict(probe, verbose=0)).ravel().tolist(),
        }
    (args.out / "rank0.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
