"""Rank 0's memory and journal size over a long run with the tracking server down (one process)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil

from hvd_mlflow.delivery.destination import Destination
from hvd_mlflow.rank_zero.run_logger import RunLogger


def main() -> None:
    epochs, metrics, journal_dir, dead_uri, run_id = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        Path(sys.argv[3]),
        sys.argv[4],
        sys.argv[5],
    )
    process = psutil.Process()
    dest = Destination(dead_uri, run_id, None, None, job_mode=False)
    run_logger = RunLogger(dest, journal_dir)
    run_logger.start()  # its sender keeps trying the dead server meanwhile, as in a real outage
    run_logger.sender.begin()  # as the callback after the first epoch's commit
    samples = []
    values = {f"m{i:03d}": 0.0 for i in range(metrics)}
    start = time.perf_counter()
    for epoch in range(epochs):
        point = (epoch, int(time.time() * 1000), {k: epoch + i * 1e-3 for i, k in enumerate(values)})
        run_logger.log_metrics_many([point])  # as the callback journals an epoch: one synced transaction
        if epoch in (epochs // 10, epochs // 2, epochs - 1):
            samples.append({"epoch": epoch + 1, "rss_mb": process.memory_info().rss / 2**20})
    append_s = (time.perf_counter() - start) / epochs
    path = run_logger.journal.location
    size = sum(Path(str(path) + s).stat().st_size for s in ("", "-wal") if Path(str(path) + s).exists())
    print("RESULT " + json.dumps({"samples": samples, "journal_mb": size / 2**20, "append_ms": append_s * 1e3,
                                  "journal": str(path)}))  # fmt: skip
    sys.stdout.flush()
    import os

    os._exit(0)  # the server is down: do not wait for the sender; the journal is what is measured


if __name__ == "__main__":
    main()
