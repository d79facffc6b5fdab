from __future__ import annotations

import logging

import numpy as np
import pytest

from hvd_mlflow.aggregate import MeanReducer, MetricKeyMismatchError, key_signature, numeric_entries, scalar
from hvd_mlflow.collectives import Solo


class TwoRanks:
    """Rank 0's view of a two-rank sum-allreduce whose other rank contributed ``other`` (a vector or keys).

    Stands in for Horovod only to check the arithmetic of the key check; the real collective is exercised
    by tests/multirank.
    """

    rank, size = 0, 2

    def __init__(self, other_values: dict[str, float]) -> None:
        self.other = other_values
        self.gathered = False

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        keys = list(self.other)
        sig = key_signature(keys)
        other = np.array([*self.other.values(), sig, sig * sig])
        if other.shape != values.shape:
            raise RuntimeError("Mismatched allreduce tensor shapes")
        return values + other

    def allgather_object(self, obj, name):
        self.gathered = True
        return [obj, list(self.other)]


def test_scalar_accepts_numbers_numpy_and_0d_arrays_only():
    assert scalar(3) == 3.0
    assert scalar(np.float32(0.5)) == 0.5
    assert scalar(np.array([[2.0]])) == 2.0
    assert scalar(True) == 1.0
    assert scalar("0.3") is None
    assert scalar(np.zeros(3)) is None
    assert scalar(None) is None


def test_numeric_entries_sorted_and_warns_once_per_non_scalar(caplog):
    caplog.set_level(logging.WARNING, "hvd_mlflow")
    logs = {"val_loss": 1.0, "loss": 2.0, "confusion": np.zeros((2, 2)), "name": "x"}
    assert list(numeric_entries(logs)) == ["loss", "val_loss"]
    numeric_entries(logs)
    assert sum("'confusion'" in r.getMessage() for r in caplog.records) == 1
    assert sum("'name'" in r.getMessage() for r in caplog.records) == 1


def test_mean_of_two_ranks():
    reducer = MeanReducer(TwoRanks({"accuracy": 0.5, "loss": 1.0}))
    assert reducer.reduce({"accuracy": 0.75, "loss": 3.0}, "t") == {"accuracy": 0.625, "loss": 2.0}


def test_same_count_different_keys_is_detected_not_mixed():
    comm = TwoRanks({"accuracy": 0.5, "mae": 1.0})
    with pytest.raises(MetricKeyMismatchError) as error:
        MeanReducer(comm).reduce({"accuracy": 0.75, "loss": 3.0}, "t")
    assert "rank 0 lacks: mae" in str(error.value)
    assert "rank 1 lacks: loss" in str(error.value)


def test_different_key_counts_are_named():
    comm = TwoRanks({"accuracy": 0.5, "loss": 1.0, "mae": 2.0})
    with pytest.raises(MetricKeyMismatchError, match="rank 0 lacks: mae"):
        MeanReducer(comm).reduce({"accuracy": 0.75, "loss": 3.0}, "t")


def test_solo_is_identity_and_runs_no_collective():
    assert MeanReducer(Solo()).reduce({"loss": 0.25}, "t") == {"loss": 0.25}


def test_signature_depends_on_order_and_names():
    assert key_signature(["a", "b"]) != key_signature(["b", "a"])
    assert key_signature(["ab"]) != key_signature(["a", "b"])
    assert 0 <= key_signature(["loss"]) < 2**20
