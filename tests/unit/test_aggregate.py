from __future__ import annotations

import logging

import numpy as np
import pytest

from hvd_mlflow.aggregate import MetricKeyMismatchError, Reducer, key_signature, numeric_entries, scalar
from hvd_mlflow.collectives import Solo
from hvd_mlflow.metric_state import MetricState


class Peer(Solo):
    """Records the vector a rank would contribute, without communicating."""

    size = 2

    def allreduce_sum(self, values, name):
        self.vector = values
        return values * 2  # never used for the result: we only want the vector


class TwoRanks:
    """Rank 0's view of a two-rank sum-allreduce whose other rank called ``reduce(other, states)``.

    Stands in for Horovod only to check the arithmetic and the layout check; the real collective is
    exercised by tests/multirank.
    """

    rank, size = 0, 2

    def __init__(self, mode: str, other: dict[str, float], states=()) -> None:
        peer = Peer()
        try:
            Reducer(peer, mode).reduce(other, "t", states)
        except MetricKeyMismatchError:
            pass
        self.other_vector, self.other_keys = peer.vector, list(other)
        self.other_layout = None

    def allreduce_sum(self, values, name):
        if values.shape != self.other_vector.shape:
            raise RuntimeError("Mismatched allreduce tensor shapes")
        return values + self.other_vector

    def allgather_object(self, obj, name):
        keys, layout = obj
        return [obj, (self.other_keys, [*self.other_keys, *layout[len(keys) :]])]


def mean_state(prefix: str, total: float, count: float, name: str) -> MetricState:
    """A Keras Mean-like state (total, count) whose result is total / count."""
    return MetricState(prefix, np.array([total, count]), count, lambda summed: {prefix + name: summed[0] / summed[1]})


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


def test_mean_of_two_ranks_is_horovods_unweighted_mean():
    reducer = Reducer(TwoRanks("mean", {"accuracy": 0.5, "loss": 1.0}), "mean")
    assert reducer.reduce({"accuracy": 0.75, "loss": 3.0}, "t") == {"accuracy": 0.625, "loss": 2.0}


def test_uneven_shards_weighted_and_exact_differ_from_the_mean():
    # rank 0 saw 100 samples with mean loss 1.0, rank 1 saw 37 with mean loss 3.0
    mine = [mean_state("", 100 * 1.0, 100, "loss")]
    theirs = [mean_state("", 37 * 3.0, 37, "loss")]
    union = (100 * 1.0 + 37 * 3.0) / 137
    for mode in ("weighted", "exact"):
        reducer = Reducer(TwoRanks(mode, {"loss": 3.0}, theirs), mode)
        assert reducer.reduce({"loss": 1.0}, "t", mine)["loss"] == pytest.approx(union, rel=1e-15)
    assert Reducer(TwoRanks("mean", {"loss": 3.0}), "mean").reduce({"loss": 1.0}, "t")["loss"] == 2.0


def test_exact_uses_the_summed_state_even_where_weighting_is_wrong():
    # a ratio metric (like precision: tp / (tp + fp)) is not the weighted mean of the ranks' ratios
    def precision(prefix, tp, fp, samples):
        return MetricState(prefix, np.array([tp, fp]), samples, lambda s: {prefix + "precision": s[0] / (s[0] + s[1])})

    reducer = Reducer(TwoRanks("exact", {"precision": 0.1}, [precision("", 1, 9, 50)]), "exact")
    value = reducer.reduce({"precision": 0.9}, "t", [precision("", 9, 1, 50)])["precision"]
    assert value == pytest.approx(10 / 20)


def test_entries_from_no_metric_fall_back_to_the_weighted_mean():
    mine, theirs = [mean_state("", 30.0, 30, "loss")], [mean_state("", 10.0, 10, "loss")]
    reducer = Reducer(TwoRanks("exact", {"loss": 1.0, "lr": 0.5}, theirs), "exact")
    out = reducer.reduce({"loss": 1.0, "lr": 0.1}, "t", mine)
    assert out["lr"] == pytest.approx((0.1 * 30 + 0.5 * 10) / 40)


def test_same_count_different_keys_is_detected_not_mixed():
    comm = TwoRanks("mean", {"accuracy": 0.5, "mae": 1.0})
    with pytest.raises(MetricKeyMismatchError) as error:
        Reducer(comm, "mean").reduce({"accuracy": 0.75, "loss": 3.0}, "t")
    assert "rank 0 lacks: mae" in str(error.value)
    assert "rank 1 lacks: loss" in str(error.value)


def test_different_key_counts_are_named():
    comm = TwoRanks("mean", {"accuracy": 0.5, "loss": 1.0, "mae": 2.0})
    with pytest.raises(MetricKeyMismatchError, match="rank 0 lacks: mae"):
        Reducer(comm, "mean").reduce({"accuracy": 0.75, "loss": 3.0}, "t")


def test_solo_runs_no_collective_and_reduces_to_itself():
    assert Reducer(Solo(), "mean").reduce({"loss": 0.25}, "t") == {"loss": 0.25}
    state = [mean_state("", 5.0, 20, "loss")]
    assert Reducer(Solo(), "exact").reduce({"loss": 0.25}, "t", state) == {"loss": 0.25}


def test_unknown_reduction_is_refused():
    with pytest.raises(ValueError, match="unknown reduction 'median'"):
        Reducer(Solo(), "median")


def test_signature_depends_on_order_and_names():
    assert key_signature(["a", "b"]) != key_signature(["b", "a"])
    assert key_signature(["ab"]) != key_signature(["a", "b"])
    assert 0 <= key_signature(["loss"]) < 2**20


class GatherPeer(Solo):
    size = 2

    def allgather(self, values, name):
        self.vector = values
        return np.concatenate([values, values])


class TwoRanksGathering:
    """Rank 0's view of a two-rank allgather (the rank spread path); the other rank reduced ``other``."""

    rank, size = 0, 2

    def __init__(self, other: dict[str, float], spread) -> None:
        peer = GatherPeer()
        Reducer(peer, "mean", spread=spread).reduce(other, "t")
        self.other_vector = peer.vector

    def allgather(self, values, name):
        return np.concatenate([values, self.other_vector])  # rank order: 0, then 1


def test_rank_spread_is_min_and_max_of_the_ranks_values_from_the_same_collective():
    comm = TwoRanksGathering({"loss": 3.0, "val_loss": 1.0}, spread=["loss"])
    reducer = Reducer(comm, "mean", spread=["loss", "absent"])
    assert reducer.reduce({"loss": 1.0, "val_loss": 2.0}, "t") == {"loss": 2.0, "val_loss": 1.5}
    assert reducer.spread == {"loss_rank_min": 1.0, "loss_rank_max": 3.0}  # only present keys, only asked ones


def test_rank_spread_with_different_keys_still_names_them():
    comm = TwoRanksGathering({"loss": 3.0, "mae": 1.0}, spread=["loss"])
    comm.allgather_object = lambda obj, name: [obj, (["loss", "mae"], ["loss", "mae", "mean"])]
    with pytest.raises(MetricKeyMismatchError, match="rank 0 lacks: mae"):
        Reducer(comm, "mean", spread=["loss"]).reduce({"loss": 1.0}, "t")
