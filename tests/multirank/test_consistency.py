"""Every rank makes the same training decisions: EarlyStopping on val_loss stops all ranks at one epoch."""

from __future__ import annotations

import pytest

from tests.support import launch

pytestmark = [pytest.mark.multirank, pytest.mark.shared, pytest.mark.timeout(600)]


def keras_stop_epoch(values: list[float], patience: int = 1, min_delta: float = 1e-3) -> int | None:
    """The epoch at which Keras' EarlyStopping(mode="min", patience, min_delta) stops on ``values``."""
    best, wait = float("inf"), 0
    for epoch, value in enumerate(values):
        if value + min_delta < best:  # Keras negates min_delta in "min" mode
            best, wait = value, 0
        else:
            wait += 1
            if wait >= patience and epoch > 0:
                return epoch
    return None


def test_early_stopping_stops_every_rank_at_the_same_epoch(tmp_path, mlflow_server):
    done = launch.run(tmp_path, ["--epochs", "40", "--early-stopping"], env={"MLFLOW_TRACKING_URI": mlflow_server.url})
    ranks = [done.check().rank(0), done.rank(1)]
    ran = [len(r["history"]["val_loss"]) for r in ranks]
    assert ran[0] == ran[1] < 40  # stopped early, together
    assert ranks[0]["history"]["val_loss"] == ranks[1]["history"]["val_loss"]
    assert keras_stop_epoch(ranks[0]["history"]["val_loss"]) == ran[0] - 1
    local_stops = [keras_stop_epoch([e["val_loss"] for e in r["local"]]) for r in ranks]
    # on their own values the ranks would have stopped at different epochs (and Horovod would have hung)
    assert local_stops[0] != local_stops[1], local_stops
