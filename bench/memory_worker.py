"""Rank 0's memory and journal size over a long run with the tracking server down (one process).

    python bench/memory_worker.py EPOCHS METRICS JOURNAL_DIR DEAD_URI RUN_ID EPOCH_S

As rank 0 in an outage: a RunLogger journals one epoch of METRICS values every EPOCH_S seconds (a fixed cadence, so
the sender keeps retrying the dead server through the whole run, as in a real outage, not only during its first
seconds) while its sender thread backs off. Before the first epoch it waits until the sender thread has imported
MLflow (the run's id is known here, so the sender opens it without a request): that one-off import, about 110 MB,
is what the issue-48 quick run read as growth. RSS is read after every epoch into a preallocated array (a growing
list would be growth of its own); ``bench/memory_slope.py`` turns the readings into a slope.
"""

from __future__ import annotations

import array
import json
import os
import sys
import time
from pathlib import Path

import psutil

from hvd_mlflow.delivery.destination import Destination
from hvd_mlflow.rank_zero.run_logger import RunLogger

IMPORT_WAIT_S = 300.0  # at most, for the sender's MLflow import (seconds on a quiet machine)


def main() -> None:
    epochs, metrics, journal_dir, dead_uri, run_id, epoch_s = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        Path(sys.argv[3]),
        sys.argv[4],
        sys.argv[5],
        float(sys.argv[6]),
    )
    process = psutil.Process()
    dest = Destination(dead_uri, run_id, None, None, job_mode=False)
    run_logger = RunLogger(dest, journal_dir)
    rss_before_import = process.memory_info().rss
    run_logger.sender.start()  # its sender keeps trying the dead server meanwhile, as in a real outage
    names = [f"m{i:03d}" for i in range(metrics)]

    def journal(epoch: int) -> float:
        """One epoch journaled as the callback does (one synced transaction); the seconds it took."""
        began = time.perf_counter()
        run_logger.log_metrics_many([(epoch, int(time.time() * 1000), {k: epoch + i * 1e-3 for i, k in
                                                                        enumerate(names)})])  # fmt: skip
        return time.perf_counter() - began

    appending = journal(0)
    run_logger.sender.wait_for_run(IMPORT_WAIT_S)  # as the callback after the first epoch's commit: the sender wakes
    # the sender opened the run (known here: no request), so MLflow is imported (private: a bench)
    assert run_logger.sender._run_opened.is_set(), f"the sender did not import MLflow in {IMPORT_WAIT_S:.0f} s"
    rss = array.array("d", bytes(8 * epochs))
    rss[0] = process.memory_info().rss
    start = time.perf_counter()
    for epoch in range(1, epochs):
        appending += journal(epoch)
        rss[epoch] = process.memory_info().rss
        time.sleep(max(0.0, start + epoch * epoch_s - time.perf_counter()))
    path = run_logger.journal.location
    size = sum(Path(str(path) + s).stat().st_size for s in ("", "-wal") if Path(str(path) + s).exists())
    result = {
        "rss_bytes": list(rss),
        "import_mb": (rss[0] - rss_before_import) / 2**20,
        "journal_mb": size / 2**20,
        "append_ms": appending / epochs * 1e3,
        "run_s": time.perf_counter() - start,
        "sender_failures": run_logger.sender._backoff.failures,  # attempts the dead server failed (private: a bench)
        "journal": str(path),
    }
    print("RESULT " + json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # the server is down: do not wait for the sender; the journal is what is measured


if __name__ == "__main__":
    main()
