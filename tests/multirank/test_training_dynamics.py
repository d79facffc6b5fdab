"""Batch-level logging every N steps and the rank spread, with two real ranks and a real server.

The truth is what Keras reported on each rank (a spy on Keras' CallbackList, before any callback runs).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import launch
from tests.support.checks import report

pytestmark = [pytest.mark.multirank, pytest.mark.shared, pytest.mark.timeout(600)]

EPOCHS, STEPS_PER_EPOCH, EVERY = 4, 6, 4  # 96 samples / batch 16 per rank


def history(client, run_id: str, key: str) -> list:
    return sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)


def test_every_n_steps_and_rank_spread(tmp_path, mlflow_server, client):
    done = launch.run(
        tmp_path,
        ["--epochs", str(EPOCHS), "--log-every-n-steps", str(EVERY), "--rank-spread", "loss,val_loss"],
        env={"MLFLOW_TRACKING_URI": mlflow_server.url},
    ).check()
    ranks = [done.rank(0), done.rank(1)]
    run_id = ranks[0]["run_id"]
    metrics = set(client.get_run(run_id).data.metrics)

    # Batch level: one point per global step N, 2N, ... (the optimizer's iterations), under batch/ keys only.
    steps = list(range(EVERY, EPOCHS * STEPS_PER_EPOCH + 1, EVERY))
    assert {"batch/loss", "batch/accuracy"} <= metrics
    local = [{b["iterations"]: b for b in r["local_batches"]} for r in ranks]
    assert sorted(local[0]) == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))  # every batch was seen, locally
    batch_error = 0.0
    for key in ("loss", "accuracy"):
        points = history(client, run_id, f"batch/{key}")
        assert [p.step for p in points] == steps, key
        for point in points:
            # equal batches on both ranks: the exact running value is the mean of the ranks' running values
            want = np.mean([local[r][point.step][key] for r in (0, 1)])
            assert point.value == pytest.approx(want, rel=1e-6, abs=1e-7), (key, point.step)
            batch_error = max(batch_error, abs(point.value - want))
        assert any(local[0][s][key] != local[1][s][key] for s in steps)  # the ranks disagreed: a real reduction
    # Epoch level is untouched: steps 0..E-1 under the plain keys.
    assert [p.step for p in history(client, run_id, "loss")] == list(range(EPOCHS))

    # Rank spread: the minimum and maximum of the ranks' own values, per epoch.
    for key in ("loss", "val_loss"):
        lows, highs = history(client, run_id, f"{key}_rank_min"), history(client, run_id, f"{key}_rank_max")
        assert [p.step for p in lows] == [p.step for p in highs] == list(range(EPOCHS))
        for epoch in range(EPOCHS):
            values = [r["local"][epoch][key] for r in ranks]
            assert lows[epoch].value == pytest.approx(min(values), rel=1e-6)
            assert highs[epoch].value == pytest.approx(max(values), rel=1e-6)
            assert lows[epoch].value < highs[epoch].value
        # the global value computed from the same (all-gathered) collective is still the ranks' mean
        for epoch, point in enumerate(history(client, run_id, key)):
            want = np.mean([r["local"][epoch][key] for r in ranks])
            assert point.value == pytest.approx(want, rel=1e-6, abs=1e-7)
    assert "accuracy_rank_min" not in metrics  # only the keys asked for
    report("batch_and_spread", batch_steps=steps, batch_points_per_key=len(steps), batch_max_abs_error=batch_error,
           spread_epochs=EPOCHS)  # fmt: skip
    # every rank's later callbacks saw the global values
    assert ranks[0]["history"]["loss"] == ranks[1]["history"]["loss"]
