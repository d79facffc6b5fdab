"""One 2-rank training for the overhead benchmark, with one of four logging set-ups (run under horovodrun).

    --variant none      no logging (the baseline)
    --variant seed      Horovod's MetricAverageCallback + a CSVLogger on rank 0 (the usual recipe; needs a Keras
                        whose Horovod callbacks work: TF 2.15's Keras 2)
    --variant mlflow    mlflow.tensorflow.autolog() on every rank (what people do today)
    --variant hvd       hvd_mlflow.autolog() (with --log-every-n-steps N: also batch-level values every N batches)

Rank 0 writes the fit time and Keras' own local values (recorded before any callback) to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

keras = tf.keras
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from train_cnn import averaging  # noqa: E402  (gradient averaging that works in every Keras flavour)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", choices=["none", "seed", "mlflow", "hvd"], required=True)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=64, help="per rank; batches of 32")
    parser.add_argument("--log-every-n-steps", type=int, default=0)
    args = parser.parse_args()

    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(args.samples, 16)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    keras.utils.set_random_seed(1)
    layers = [keras.Input(shape=(16,)), keras.layers.Dense(16, "relu"), keras.layers.Dense(1, "sigmoid")]
    model = keras.Sequential(layers)
    optimizer = averaging(keras.optimizers.SGD(0.01))  # a real Horovod training averages its gradients
    model.compile(optimizer=optimizer, loss="binary_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # warm-up, before any logging: tracing is not measured

    callbacks: list = []
    if args.variant == "mlflow":
        import mlflow.tensorflow

        mlflow.tensorflow.autolog(log_models=False, log_datasets=False, checkpoint=False)
    if args.variant == "hvd":
        import hvd_mlflow

        hvd_mlflow.autolog(log_every_n_steps=args.log_every_n_steps)
    if args.variant == "seed":
        import horovod.tensorflow.keras as hvd_keras

        callbacks.append(hvd_keras.callbacks.MetricAverageCallback())
        if hvd.rank() == 0:
            callbacks.append(keras.callbacks.CSVLogger(str(args.out / "training_metrics.csv")))

    local: list[dict] = []
    timing = {"train_end_s": 0.0}
    callback_list = type(keras.callbacks.CallbackList([]))
    on_epoch_end, on_train_end = callback_list.on_epoch_end, callback_list.on_train_end

    def spy(self, epoch, logs=None):
        local.append({k: float(np.asarray(v)) for k, v in (logs or {}).items()})
        return on_epoch_end(self, epoch, logs)

    def timed_train_end(self, logs=None):  # the end of fit: from here until fit returns (autolog ends it after)
        timing["train_end_began"] = time.perf_counter()
        return on_train_end(self, logs)

    callback_list.on_epoch_end = spy
    callback_list.on_train_end = timed_train_end
    hvd.allreduce(np.zeros(1), name="bench.start")
    start = time.perf_counter()
    model.fit(x, y, batch_size=32, epochs=args.epochs, validation_data=(x[:32], y[:32]), callbacks=callbacks, verbose=0)
    end = time.perf_counter()
    seconds = end - start
    timing["train_end_s"] = end - timing.get("train_end_began", end)
    end_flush = hvd.allgather_object(timing["train_end_s"], name="bench.flush")[0]
    gathered = hvd.allgather_object(local, name="bench.local")
    if hvd.rank() == 0:
        result = {"fit_seconds": seconds, "end_of_fit_flush_s": end_flush, "local": gathered}
        (args.out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
