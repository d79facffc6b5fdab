"""The per-epoch cost of logging, measured by pairs inside one 2-rank job, on a realistic model or the small one.

``--model realistic``: a dense 128-512-512-1 model on 4,096 samples per rank (batches of 128: 32 steps, about half
a second per epoch on these CPUs), ``accuracy`` and ``AUC``, gradients averaged over the ranks, validation on 512
samples. ``--model small``: overhead_worker.py's dense 16-16-1 on 64 samples per rank, ``accuracy``, 2 steps and
validation on 32 (~40 ms epochs: the worst case for per-epoch costs). ``--model batches``: the same model on 2,048
samples per rank, 64 steps of ~2 ms per epoch (variants ``hvd-batch1`` and ``hvd-batch10``: ``log_every_n_steps``
1 and 10, against ``hvd``, epoch-only logging). Fits run in
pairs: one without logging, one with the variant (the order alternates from pair to pair), so that the machine's
drift cancels inside each pair; separate processes per variant were +-7% noisy here, too much to see 1%.

Per fit, the per-epoch time is the median, over its epochs, of the wall time from an epoch's begin to the end of
its last callback on rank 0. With ``--profile`` on a ``hvd-batch<N>`` variant, the callback's whole
batch hook is timed per epoch on rank 0's training thread (``batch_hook_ms``), with the sender's CPU. With
``--profile`` (variant ``hvd``), hvd-mlflow's parts are timed every epoch: the
metric-state capture, the collective, the result computation from the summed state, the journal append (with
its fsync), the rest of its epoch end, and the CPU time of rank 0's sender thread (the mean: it works every few
epochs when they are short), on rank 0; the collective also
on rank 1, since on rank 0 it includes waiting for the other rank: the last rank to arrive spends only the
collective's own time in it (``collective_last_rank_ms``). The floors the parts are held against are measured in
the same job, at the same point of the epochs of one more no-logging fit that is not timed (``floors_ms``):
Horovod's smallest collective (one 16-value allreduce, at the last rank to arrive), one compiled TensorFlow call
with its device-to-host transfer, one small write with its fsync next to the journal; and the CPU time of one
``MlflowClient.log_batch`` of the epoch's metrics, on rank 0. ``outside_collective_ms``: the median, over epochs, of
rank 0's epoch end without its collective (what hvd-mlflow's own code costs the training thread, without the wait for
the other rank, which the ranks' skew decides), the first fit's epochs left out when there are several pairs (they
hold the sender's one-off import of MLflow, about a second of CPU); ``python -m bench.run --quick`` checks it. Each
rank runs TensorFlow on ``--threads`` threads (1 by default: one rank per core, as Horovod advises on CPUs).

With ``--against`` another variant (``seed``), the other fit of each pair runs that variant instead of no
logging: the two are then compared head to head, without the noise of two separate differences to no logging.

Rank 0 writes ``result.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

keras = tf.keras
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from train_cnn import averaging  # noqa: E402  (gradient averaging that works in every Keras flavour)

PROFILE: dict[str, list[float]] = collections.defaultdict(list)


def timed(owner: object, name: str, part: str) -> None:
    """Accumulate the wall time of ``owner.name`` into the current epoch's ``part``."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            PROFILE[part][-1] += time.perf_counter() - start

    setattr(owner, name, wrapper)


PARTS = ("capture_ms", "collective_ms", "compute_ms", "journal_append_ms", "epoch_end_total_ms", "sender_cpu_ms")
BATCH_PARTS = ("batch_hook_ms", "sender_cpu_ms")  # the hvd-batch<N> variants' profile


def instrument(batches: bool = False) -> None:
    """Time hvd-mlflow's parts every epoch: the epoch's (variant ``hvd``) or, with ``batches``, the whole of the
    callback's batch hook on the training thread (every logged batch's state read, and the batch collectives)."""
    from hvd_mlflow import callback
    from hvd_mlflow.delivery import journal
    from hvd_mlflow.every_rank import collectives, metric_state

    for part in BATCH_PARTS if batches else PARTS:
        PROFILE[part] = [0.0]  # the slot timers add to (a new one each profiled epoch)
    if batches:
        timed(callback.HorovodMlflowCallback, "on_train_batch_end", "batch_hook_ms")
        return
    timed(metric_state, "capture", "capture_ms")
    timed(collectives.Horovod, "allreduce_sum", "collective_ms")
    timed(collectives.Horovod, "allgather", "collective_ms")
    timed(metric_state._Computer, "many", "compute_ms")
    timed(journal.LiveJournal, "append", "journal_append_ms")
    timed(journal.LiveJournal, "append_many", "journal_append_ms")  # the epoch's (with its batch points)
    timed(callback.HorovodMlflowCallback, "on_epoch_end", "epoch_end_total_ms")
    timed(callback.HorovodMlflowCallback, "on_test_begin", "epoch_end_total_ms")


def sender_cpu_s() -> float:
    """The CPU time rank 0's sender thread has used so far (0 when there is none)."""
    for thread in threading.enumerate():
        if thread.name == "hvd-mlflow-sender" and thread.ident is not None:
            try:
                return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except OSError:  # it just ended
                return 0.0
    return 0.0


class EpochClock(keras.callbacks.Callback):
    """Last in the list: the epoch's wall time, begin to the end of every callback."""

    def __init__(self, profiled: bool) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self.profiled = profiled

    def on_epoch_begin(self, epoch, logs=None):
        self.began = time.perf_counter()
        if self.profiled:
            for part in PROFILE:
                PROFILE[part].append(0.0)
            self.sender_began = sender_cpu_s()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.began)
        if self.profiled:  # what the sender used during this epoch (delivering the previous one, in practice)
            PROFILE["sender_cpu_ms"][-1] = max(0.0, sender_cpu_s() - self.sender_began)


FLOORS: dict[str, list[float]] = collections.defaultdict(list)


class Floors(keras.callbacks.Callback):
    """In the no-logging fits of a profiled job: the floor of each part, at the same point of the epoch."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.path = out / f"floor-{hvd.rank()}.bin"
        self.call = tf.function(lambda: tf.reduce_sum(tf.ones(16)))

    def on_epoch_end(self, epoch, logs=None):
        start = time.perf_counter()
        hvd.allreduce(tf.zeros(16), op=hvd.Sum, name="bench.floor")
        FLOORS["collective"].append(time.perf_counter() - start)
        start = time.perf_counter()
        self.call().numpy()
        FLOORS["call_and_transfer"].append(time.perf_counter() - start)
        start = time.perf_counter()
        with open(self.path, "ab") as file:
            file.write(b"x" * 200)
            file.flush()
            os.fsync(file.fileno())
        FLOORS["write_and_fsync"].append(time.perf_counter() - start)


FLOOR_REQUESTS = 5  # the metric requests the request floor sends (the bench subtracts them from its count)


def request_cpu_floor_ms(logs: dict[str, float], repeats: int = FLOOR_REQUESTS) -> float:
    """Rank 0: the CPU time of one ``MlflowClient.log_batch`` of the epoch's metrics (median of ``repeats``)."""
    import mlflow
    from mlflow.entities import Metric

    client = mlflow.MlflowClient()
    run_id = client.create_run(os.environ["MLFLOW_EXPERIMENT_ID"]).info.run_id
    seconds = []
    for step in range(repeats):
        metrics = [Metric(k, v, int(time.time() * 1000), step) for k, v in logs.items()]
        start = time.thread_time()
        client.log_batch(run_id, metrics=metrics)
        seconds.append(time.thread_time() - start)
    client.set_terminated(run_id)
    return statistics.median(seconds) * 1000


MODELS = {  # name: (samples per rank, batch size, validation samples)
    "realistic": (4096, 128, 512),  # dense 128-512-512-1, accuracy and AUC: ~0.4 s epochs of 32 steps
    "small": (64, 32, 32),  # overhead_worker.py's dense 16-16-1, accuracy: ~35 ms epochs of 2 steps, the worst case
    "batches": (2048, 32, 256),  # the same dense 16-16-1 on 64 steps of ~2 ms: what per-batch logging costs
}


def model_and_data(name: str, rank: int):
    samples = MODELS[name][0]
    rng = np.random.default_rng(rank)
    keras.utils.set_random_seed(1)
    dense = keras.layers.Dense
    if name in ("small", "batches"):
        x = rng.normal(size=(samples, 16)).astype("float32")
        y = (x.sum(axis=1) > 0).astype("float32")
        model = keras.Sequential([keras.Input(shape=(16,)), dense(16, "relu"), dense(1, "sigmoid")])
        metrics: list = ["accuracy"]
    else:
        x = rng.normal(size=(samples, 128)).astype("float32")
        y = (x[:, :16].sum(axis=1) + rng.normal(size=samples) > 0).astype("float32")
        model = keras.Sequential([keras.Input(shape=(128,)), dense(512, activation="relu"),
                                  dense(512, activation="relu"), dense(1, "sigmoid")])  # fmt: skip
        metrics = ["accuracy", keras.metrics.AUC(name="auc")]
    model.compile(optimizer=averaging(keras.optimizers.SGD(0.01)), loss="binary_crossentropy", metrics=metrics)
    return model, x, y


VARIANTS = ("hvd", "hvd-eager", "hvd-mean", "hvd-system", "hvd-batch1", "hvd-batch10", "seed", "mlflow")


def never_traced(on: bool) -> None:
    """Variant ``hvd-eager``: hvd-mlflow's own functions are never traced, nor called compiled if an earlier fit of
    the job traced them (every epoch end computes eagerly), to weigh the background tracing
    (hvd_mlflow/every_rank/tracing.py) against what it saves."""
    from hvd_mlflow.every_rank import tracing

    if not hasattr(tracing.Traced, "_bench_start"):
        tracing.Traced._bench_start, tracing.Traced._bench_ready = tracing.Traced.start, tracing.Traced.ready
    tracing.Traced.start = (lambda self: None) if on else tracing.Traced._bench_start
    tracing.Traced.ready = property(lambda self: False) if on else tracing.Traced._bench_ready


def switch(variant: str, on: bool, out: Path) -> list:
    """Turn ``variant``'s logging on or off for the next fit; the callbacks it needs (``none``: nothing)."""
    import hvd_mlflow

    if variant.startswith("hvd"):
        if on:  # hvd-batch<N>: log_every_n_steps=N
            every = int(variant.removeprefix("hvd-batch")) if variant.startswith("hvd-batch") else 0
            never_traced(variant == "hvd-eager")
            hvd_mlflow.autolog(reduction="mean" if variant == "hvd-mean" else "exact", log_models=False,
                               system_metrics=variant == "hvd-system", log_every_n_steps=every)  # fmt: skip
        else:
            hvd_mlflow.autolog(disable=True)
        return []
    if variant == "mlflow":
        import mlflow.tensorflow

        mlflow.tensorflow.autolog(disable=not on, log_models=False, log_datasets=False, checkpoint=False)
        return []
    if variant == "seed" and on:
        import horovod.tensorflow.keras as hvd_keras

        callbacks = [hvd_keras.callbacks.MetricAverageCallback()]
        if hvd.rank() == 0:
            callbacks.append(keras.callbacks.CSVLogger(str(out / "training_metrics.csv")))
        return callbacks
    return []


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--against", choices=["none", *VARIANTS], default="none", help="the other fit of each pair")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--model", choices=sorted(MODELS), default="realistic")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="TensorFlow threads per rank (0: TensorFlow's default)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.threads:  # one rank per core, as Horovod advises on CPUs: 2 ranks x 2 threads on 2 cores is noisy
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    hvd.init()
    model, x, y = model_and_data(args.model, hvd.rank())
    _, batch, validation = MODELS[args.model]
    xv, yv = x[:validation], y[:validation]
    model.fit(x, y, batch_size=batch, epochs=1, validation_data=(xv, yv), verbose=0)  # warm-up: tracing not measured
    if args.profile:
        instrument(batches=args.variant.startswith("hvd-batch"))
    pairs = []
    for pair in range(args.pairs):
        order = [False, True] if pair % 2 == 0 else [True, False]
        medians, cpus = {}, {}
        for on in order:
            running = args.variant if on else args.against
            callbacks = switch(running, True, args.out)
            clock = EpochClock(profiled=on and args.profile)
            hvd.allreduce(np.zeros(1), name=f"bench.pair.{pair}.{on}")  # both ranks start together
            cpu = time.process_time()
            model.fit(x, y, batch_size=batch, epochs=args.epochs, validation_data=(xv, yv), verbose=0,
                      callbacks=[*callbacks, clock])  # fmt: skip
            cpu = time.process_time() - cpu  # the whole process: training, hvd-mlflow's threads, the end of fit
            medians[on] = statistics.median(clock.seconds)
            cpus[on] = sum(hvd.allgather_object(cpu, name=f"bench.cpu.{pair}.{on}")) / args.epochs
            switch(running, False, args.out)
        pairs.append({"without_s": medians[False], "with_s": medians[True], "cpu_without_s": cpus[False],
                      "cpu_with_s": cpus[True]})  # fmt: skip
    floored = args.profile and args.variant == "hvd"
    if floored:  # the floors, in a no-logging fit of their own: the pairs' timed fits do not carry them
        history = model.fit(x, y, batch_size=batch, epochs=args.epochs, validation_data=(xv, yv), verbose=0,
                            callbacks=[Floors(args.out)])  # fmt: skip
    # the collective waits for the last rank to arrive: its own cost is what the last one spends in it
    collective = hvd.allgather_object(PROFILE.get("collective_ms", [0.0])[1:], name="bench.collectives")
    floor_collective = hvd.allgather_object(FLOORS.get("collective", []), name="bench.floor_collectives")
    if hvd.rank() == 0:
        profile = {part: statistics.median(v[1:]) * 1000 for part, v in PROFILE.items() if len(v) > 1}
        if len(PROFILE.get("sender_cpu_ms", [])) > 1:  # it works every few epochs on short ones: the mean
            profile["sender_cpu_ms"] = statistics.mean(PROFILE["sender_cpu_ms"][1:]) * 1000
        if len(PROFILE.get("collective_ms", [])) > 1:  # rank 0's epoch end but its collective, epoch by epoch
            skip = 1 + (args.epochs if args.pairs > 1 else 0)  # the first fit holds MLflow's one-off import
            ends, collectives = PROFILE["epoch_end_total_ms"][skip:], PROFILE["collective_ms"][skip:]
            outside = [end - within for end, within in zip(ends, collectives, strict=True)]
            profile["outside_collective_ms"] = statistics.median(outside) * 1000
        if floored:
            last = [min(epoch) for epoch in zip(*collective, strict=True)]
            profile["collective_last_rank_ms"] = statistics.median(last) * 1000
        floors = {}
        if floored:
            last = [min(epoch) for epoch in zip(*floor_collective, strict=True)]
            floors = {"collective_last_rank_ms": statistics.median(last) * 1000}
            floors.update({f"{k}_ms": statistics.median(v) * 1000 for k, v in FLOORS.items() if k != "collective"})
            logs = {k: float(v[-1]) for k, v in history.history.items()}
            logs.update({"epoch_time_s": 0.4, "samples_per_s": 20000.0, "learning_rate": 0.01})
            floors["request_cpu_ms"] = request_cpu_floor_ms(logs)
        result = {"pairs": pairs, "profile_ms": profile, "floors_ms": floors, "epochs": args.epochs,
                  "threads": args.threads, "floor_requests": FLOOR_REQUESTS if floors else 0}  # fmt: skip
        (args.out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
