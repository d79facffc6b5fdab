"""What the divergence check costs each epoch on every rank: the weight fingerprint of a model of about 1 M and
25 M parameters, on the CPU, in one process (median of repeated calls, after the first that compiles it)."""

from __future__ import annotations

import json
import statistics
import sys
import time

import tensorflow as tf

from hvd_mlflow.every_rank import divergence

keras = tf.keras


def model_of(width: int, depth: int):
    layers = [keras.Input(shape=(width,))] + [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    return keras.Sequential([*layers, keras.layers.Dense(1)])


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    out = {}
    for label, width, depth in (("1M", 1000, 1), ("25M", 2500, 4)):
        model = model_of(width, depth)
        params = int(sum(tf.size(v).numpy() for v in model.trainable_variables))
        divergence.fingerprint(model)  # compiles it
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            divergence.fingerprint(model)
            times.append(time.perf_counter() - start)
        out[label] = {"parameters": params, "median_ms": statistics.median(times) * 1000, "max_ms": max(times) * 1000}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
