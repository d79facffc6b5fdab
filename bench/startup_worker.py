"""One 2-rank job's start-up, for the start-up benchmark (run under horovodrun): what a user's script pays before
its first epoch ends.

    --variant none      no logging
    --variant hvd       import hvd_mlflow; hvd_mlflow.autolog()
    --variant hvd-default  the same, without MLFLOW_TRACKING_URI: MLflow's default store (the quickstart's path)
    --variant mlflow    import mlflow; mlflow.tensorflow.autolog()  (on every rank, as people do)

TensorFlow and Horovod are imported first (every training script imports them whatever it logs with). Rank 0
writes to --out: the seconds of the logging set-up (the import and the autolog call) and from ``fit()`` to the
end of the first epoch (its last callback included), and the fit's whole time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

keras = tf.keras


class FirstEpoch(keras.callbacks.Callback):
    """Last in the list: when the first epoch's last callback is done."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            self.at = time.perf_counter()


def set_up(variant: str) -> float:
    start = time.perf_counter()
    if variant in ("hvd", "hvd-default"):
        import hvd_mlflow

        hvd_mlflow.autolog(log_models=False)
    elif variant == "mlflow":
        import mlflow.tensorflow

        mlflow.tensorflow.autolog(log_models=False, log_datasets=False, checkpoint=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", choices=["none", "hvd", "hvd-default", "mlflow"], required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    hvd.init()
    set_up_s = set_up(args.variant)
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(256, 16)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(16, "relu"),
                              keras.layers.Dense(1, "sigmoid")])  # fmt: skip
    model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=["accuracy"])
    first = FirstEpoch()
    hvd.allreduce(np.zeros(1), name="bench.startup")  # both ranks start fit together
    start = time.perf_counter()
    model.fit(x, y, batch_size=32, epochs=args.epochs, validation_data=(x[:64], y[:64]), callbacks=[first], verbose=0)
    fit_s = time.perf_counter() - start
    if hvd.rank() == 0:
        result = {"set_up_s": set_up_s, "first_epoch_end_s": first.at - start, "fit_s": fit_s}
        (args.out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
