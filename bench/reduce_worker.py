"""Reduction cost at 2 ranks: hvd-mlflow's one fused collective against one allreduce per key (what Horovod's
MetricAverageCallback does, reimplemented on horovod.tensorflow since the callback cannot run on Keras 3)."""

from __future__ import annotations

import json
import statistics
import sys
import time

import horovod.tensorflow as hvd
import numpy as np

from hvd_mlflow.every_rank.aggregate import Part, Reducer
from hvd_mlflow.every_rank.collectives import Horovod


def per_key(values: dict[str, float]) -> dict[str, float]:
    return {k: float(hvd.allreduce(np.array(values[k]), op=hvd.Average, name=f"per_key.{k}")) for k in sorted(values)}


def main() -> None:
    hvd.init()
    counts = [int(c) for c in sys.argv[1].split(",")]
    repeats = int(sys.argv[2])
    reducer = Reducer(Horovod(hvd), mode="mean")  # the values alone, as per-key allreduce does
    results = {}
    for count in counts:
        values = {f"metric_{i:04d}": float(i + hvd.rank()) for i in range(count)}
        timings: dict[str, list[float]] = {"fused": [], "per_key": []}
        for method in ("fused", "per_key", "fused", "per_key"):  # warm-up rounds, then measure below
            (reducer.reduce_all([Part(values)], "bench") if method == "fused" else per_key(values))
        for _ in range(repeats):
            for method in ("fused", "per_key"):
                hvd.allreduce(np.zeros(1), name="bench.barrier")
                start = time.perf_counter()
                out = reducer.reduce_all([Part(values)], "bench")[0].values if method == "fused" else per_key(values)
                timings[method].append((time.perf_counter() - start) * 1e6)
                assert abs(out["metric_0000"] - 0.5) < 1e-12
        results[count] = {m: statistics.median(t) for m, t in timings.items()}
    if hvd.rank() == 0:
        print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
