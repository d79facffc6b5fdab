"""Horovod elastic training (tf_keras / Keras 2) with hvd-mlflow's autolog, for the elastic test.

Each process appends, per epoch it completes, a line to ``epochs-<pid>.jsonl`` in ``--out``: the elastic
state's epoch (the global epoch), this process's rank and the world size then, Keras' local logs (recorded
before any callback runs) and the logs after every callback (the global values). The process that starts as
rank ``--kill-start-rank`` (default 0) SIGKILLs itself at the end of global epoch ``--kill-at``, after every
callback (the commit included).
With ``--every N``, batch values are logged every N steps (``log_every_n_steps``).
With ``--idle-probe S``, a survivor measures its own CPU time over S idle seconds
right after the reset (at the restarted fit's train begin) and after the training, into ``done-<pid>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import hvd_mlflow

keras = tf.keras


def data(rank: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + rank + seed)
    x = rng.normal(loc=0.4 * rank, size=(n, 8)).astype("float32")
    y = (x.sum(axis=1) + rng.normal(size=n) > 0.5 * rank).astype("float32")
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--kill-at", type=int, default=2)
    parser.add_argument("--kill-start-rank", type=int, default=0)
    parser.add_argument("--idle-probe", type=float, default=0.0)
    parser.add_argument("--every", type=int, default=0, help="log_every_n_steps")
    args = parser.parse_args()
    hvd.init()
    doomed = hvd.rank() == args.kill_start_rank
    probes: dict[str, float] = {}
    logging.basicConfig(level=logging.INFO, format=f"[pid {os.getpid()}] %(name)s %(levelname)s: %(message)s")
    logging.getLogger("hvd_mlflow").setLevel(logging.INFO)
    hvd_mlflow.autolog(log_every_n_steps=args.every)
    keras.utils.set_random_seed(7)
    model = keras.Sequential(
        [keras.Input(shape=(8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1, "sigmoid")]
    )
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="binary_crossentropy",
        metrics=["accuracy"],
    )  # fmt: skip
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    log_file = args.out / f"epochs-{os.getpid()}.jsonl"

    callback_list = keras.callbacks.CallbackList
    original = callback_list.on_epoch_end

    def on_epoch_end(self, epoch, logs=None):
        global_epoch = int(state.epoch)  # Horovod's UpdateEpochStateCallback moves it on after this
        local = {k: float(np.asarray(v)) for k, v in (logs or {}).items()}
        result = original(self, epoch, logs)
        line = {"epoch": global_epoch, "time": time.time(), "rank": hvd.rank(), "size": hvd.size(), "local": local,
                "global": {k: float(np.asarray(v)) for k, v in logs.items()}}  # fmt: skip
        with log_file.open("a") as f:
            f.write(json.dumps(line) + "\n")
        if doomed and global_epoch == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    callback_list.on_epoch_end = on_epoch_end

    class IdleProbe(keras.callbacks.Callback):
        """After a reset (a fit that starts past epoch 0), idle a while and measure this process's CPU time."""

        def on_train_begin(self, logs=None):
            if args.idle_probe and int(state.epoch) > 0 and "after_reset" not in probes:
                probes["after_reset"] = idle_cpu_fraction(args.idle_probe)

    callbacks = [hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state), IdleProbe()]

    @hvd.elastic.run
    def train(state):
        x, y = data(hvd.rank(), 96)
        xv, yv = data(hvd.rank(), 48, seed=10)
        model.fit(x, y, batch_size=16, epochs=args.epochs - state.epoch, validation_data=(xv, yv),
                  callbacks=callbacks, verbose=0)  # fmt: skip

    train(state)
    if args.idle_probe:
        probes["after_fit"] = idle_cpu_fraction(args.idle_probe)
    (args.out / f"done-{os.getpid()}.json").write_text(json.dumps({"epoch": int(state.epoch), "idle_cpu": probes}))


def idle_cpu_fraction(seconds: float) -> dict:
    """This process's CPU time over ``seconds`` of doing nothing, as a fraction of the wall time: in all, and per
    thread (Linux's /proc/self/task), by its Python name, or ``native`` for threads Python did not start (TensorFlow's,
    Horovod's background loop)."""
    cpu, wall, threads = time.process_time(), time.monotonic(), thread_cpu()
    time.sleep(seconds)
    elapsed = time.monotonic() - wall
    after = thread_cpu()
    by_name: dict[str, float] = {}
    for tid, (name, ticks) in after.items():
        by_name[name] = by_name.get(name, 0.0) + (ticks - threads.get(tid, (name, 0))[1]) / os.sysconf("SC_CLK_TCK")
    return {"total": (time.process_time() - cpu) / elapsed, "threads": {k: v / elapsed for k, v in by_name.items()}}


def thread_cpu() -> dict[str, tuple[str, int]]:
    """tid -> (thread name, user + system clock ticks so far)."""
    out = {}
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = names.get(int(task.name), "native")
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[task.name] = (name, int(fields[11]) + int(fields[12]))
        except (OSError, IndexError, ValueError):  # the thread ended meanwhile
            continue
    return out


if __name__ == "__main__":
    main()
