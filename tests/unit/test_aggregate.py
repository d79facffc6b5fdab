from __future__ import annotations

import logging

import numpy as np
import pytest

from hvd_mlflow.every_rank import tracing
from hvd_mlflow.every_rank.aggregate import (
    MetricKeyMismatchError,
    Part,
    Reducer,
    key_signature,
    numeric_entries,
    scalar,
)
from hvd_mlflow.every_rank.collectives import Solo
from hvd_mlflow.every_rank.metric_state import MetricState


def test_every_engine_defines_its_own_collectives():
    """Solo, the base of every engine, is one process (its collectives are the identity): an engine of several
    processes that inherited one of them would log each rank's own values with no error."""
    from hvd_mlflow.every_rank import collectives

    engines = [c for c in vars(collectives).values() if isinstance(c, type) and issubclass(c, Solo) and c is not Solo]
    assert {c.__name__ for c in engines} == {"Horovod", "TfDistribute", "Jax"}
    for engine in engines:
        for method in ("allreduce_sum", "allgather", "allgather_object"):
            assert method in vars(engine), f"{engine.__name__} inherits Solo's {method} (one process's identity)"


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
    logs_are_global = False  # as Horovod: each rank's logs hold its own values
    values_are_global = False

    def __init__(self, mode: str, other: dict[str, float], states=()) -> None:
        peer = Peer()
        try:
            Reducer(peer, mode).reduce_all([Part(other, tuple(states))], "t")[0]
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
    assert reducer.reduce_all([Part({"accuracy": 0.75, "loss": 3.0})], "t")[0].values == {
        "accuracy": 0.625,
        "loss": 2.0,
    }


def test_uneven_shards_weighted_and_exact_differ_from_the_mean():
    # rank 0 saw 100 samples with mean loss 1.0, rank 1 saw 37 with mean loss 3.0
    mine = [mean_state("", 100 * 1.0, 100, "loss")]
    theirs = [mean_state("", 37 * 3.0, 37, "loss")]
    union = (100 * 1.0 + 37 * 3.0) / 137
    for mode in ("weighted", "exact"):
        reducer = Reducer(TwoRanks(mode, {"loss": 3.0}, theirs), mode)
        assert reducer.reduce_all([Part({"loss": 1.0}, tuple(mine))], "t")[0].values["loss"] == pytest.approx(
            union, rel=1e-15
        )
    assert (
        Reducer(TwoRanks("mean", {"loss": 3.0}), "mean").reduce_all([Part({"loss": 1.0})], "t")[0].values["loss"] == 2.0
    )


def test_exact_uses_the_summed_state_even_where_weighting_is_wrong():
    # a ratio metric (like precision: tp / (tp + fp)) is not the weighted mean of the ranks' ratios
    def precision(prefix, tp, fp, samples):
        return MetricState(prefix, np.array([tp, fp]), samples, lambda s: {prefix + "precision": s[0] / (s[0] + s[1])})

    reducer = Reducer(TwoRanks("exact", {"precision": 0.1}, [precision("", 1, 9, 50)]), "exact")
    value = reducer.reduce_all([Part({"precision": 0.9}, (precision("", 9, 1, 50),))], "t")[0].values["precision"]
    assert value == pytest.approx(10 / 20)


def test_entries_from_no_metric_fall_back_to_the_weighted_mean():
    mine, theirs = [mean_state("", 30.0, 30, "loss")], [mean_state("", 10.0, 10, "loss")]
    reducer = Reducer(TwoRanks("exact", {"loss": 1.0, "lr": 0.5}, theirs), "exact")
    out = reducer.reduce_all([Part({"loss": 1.0, "lr": 0.1}, tuple(mine))], "t")[0].values
    assert out["lr"] == pytest.approx((0.1 * 30 + 0.5 * 10) / 40)


def test_same_count_different_keys_is_detected_not_mixed():
    comm = TwoRanks("mean", {"accuracy": 0.5, "mae": 1.0})
    with pytest.raises(MetricKeyMismatchError) as error:
        Reducer(comm, "mean").reduce_all([Part({"accuracy": 0.75, "loss": 3.0})], "t")[0]
    assert "rank 0 lacks: mae" in str(error.value)
    assert "rank 1 lacks: loss" in str(error.value)


def test_different_key_counts_are_named():
    comm = TwoRanks("mean", {"accuracy": 0.5, "loss": 1.0, "mae": 2.0})
    with pytest.raises(MetricKeyMismatchError, match="rank 0 lacks: mae"):
        Reducer(comm, "mean").reduce_all([Part({"accuracy": 0.75, "loss": 3.0})], "t")[0]


def test_solo_runs_no_collective_and_reduces_to_itself():
    assert Reducer(Solo(), "mean").reduce_all([Part({"loss": 0.25})], "t")[0].values == {"loss": 0.25}
    state = [mean_state("", 5.0, 20, "loss")]
    assert Reducer(Solo(), "exact").reduce_all([Part({"loss": 0.25}, tuple(state))], "t")[0].values == {"loss": 0.25}


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
    logs_are_global = False  # as Horovod: each rank's logs hold its own values
    values_are_global = False

    def __init__(self, other: dict[str, float], spread) -> None:
        peer = GatherPeer()
        Reducer(peer, "mean", spread=spread).reduce_all([Part(other)], "t")[0]
        self.other_vector = peer.vector

    def allgather(self, values, name):
        return np.concatenate([values, self.other_vector])  # rank order: 0, then 1


def test_rank_spread_is_min_and_max_of_the_ranks_values_from_the_same_collective():
    comm = TwoRanksGathering({"loss": 3.0, "val_loss": 1.0}, spread=["loss"])
    reducer = Reducer(comm, "mean", spread=["loss", "absent"])
    reduced = reducer.reduce_all([Part({"loss": 1.0, "val_loss": 2.0})], "t")[0]
    assert reduced.values == {"loss": 2.0, "val_loss": 1.5}
    assert reduced.spread == {"loss_rank_min": 1.0, "loss_rank_max": 3.0}  # only present keys, only asked ones


def test_rank_spread_with_different_keys_still_names_them():
    comm = TwoRanksGathering({"loss": 3.0, "mae": 1.0}, spread=["loss"])
    comm.allgather_object = lambda obj, name: [obj, (["loss", "mae"], ["loss", "mae", "mean"])]
    with pytest.raises(MetricKeyMismatchError, match="rank 0 lacks: mae"):
        Reducer(comm, "mean", spread=["loss"]).reduce_all([Part({"loss": 1.0})], "t")[0]


def packed(keys, values, samples, states, carry, layout):
    """The vector one rank sends, built by hand from the layout documented in hvd_mlflow/every_rank/aggregate.py (not
    with the code under test): values, values x samples, samples, each state's variables, carried values, then the
    layout's signature h and h*h."""
    import zlib

    h = float(zlib.crc32("\x00".join(layout).encode()) & (2**20 - 1))
    return np.array([*values, *(v * s for v, s in zip(values, samples, strict=True)), *samples,
                     *(x for state in states for x in state), *carry, h, h * h])  # fmt: skip


def test_the_packed_vector_is_the_documented_layout():
    peer = Peer()
    state = MetricState("", np.array([150.0, 100.0]), 100.0, lambda s: {"loss": s[0] / s[1]})
    Reducer(peer, "exact").reduce_all([Part({"acc": 0.5, "loss": 1.5}, (state,), {"rank0_step": 42.0})], "t")[0]
    want = packed(["acc", "loss"], [0.5, 1.5], [100.0, 100.0], [[150.0, 100.0]], [42.0],
                  ["acc", "loss", "exact", ":2", "+rank0_step"])  # fmt: skip
    assert peer.vector.tolist() == want.tolist()


class HandBuiltPeer:
    """Rank 0's view of a two-rank sum where the other rank's vector is built by hand (``packed``)."""

    rank, size = 0, 2
    logs_are_global = False  # as Horovod: each rank's logs hold its own values
    values_are_global = False

    def __init__(self, other: np.ndarray) -> None:
        self.other = other

    def allreduce_sum(self, values, name):
        return values + self.other


def test_carried_values_are_summed_and_not_additive_keys_are_weighted():
    layout = ["loss", "max_err", "exact", ":2", "+rank0_step"]
    # the other rank: loss 3.0 and max_err 0.2 over 37 samples, state (111, 37), carries 0 (it is not rank 0)
    other = packed(["loss", "max_err"], [3.0, 0.2], [37.0, 37.0], [[111.0, 37.0]], [0.0], layout)
    state = MetricState("", np.array([100.0, 100.0]), 100.0, lambda s: {"loss": s[0] / s[1], "max_err": 99.0})
    reducer = Reducer(HandBuiltPeer(other), "exact")
    part = Part({"loss": 1.0, "max_err": 0.8}, (state,), {"rank0_step": 42.0}, not_additive=frozenset({"max_err"}))
    [reduced] = reducer.reduce_all([part], "t")
    out = reduced.values
    assert out["loss"] == pytest.approx(211 / 137)  # from the summed state
    assert out["max_err"] == pytest.approx((0.8 * 100 + 0.2 * 37) / 137)  # weighted: never the summed state's
    assert reduced.carried == {"rank0_step": 42.0} and reduced.inexact == {"max_err"}


def test_parts_ride_end_to_end_with_one_signature_and_each_is_reduced_alone():
    """Logged batches kept until the epoch end ride in its collective: the parts' vectors end to end, then one
    signature of the whole layout (the same place on every rank); each part's values from its own states."""
    from hvd_mlflow.every_rank.aggregate import Part

    batch_layout, epoch_layout = ["loss", "exact", ":2"], ["loss", "exact", ":2", "+rank0_step"]
    whole = [*batch_layout, "|", *epoch_layout]
    h = float(__import__("zlib").crc32("\x00".join(whole).encode()) & (2**20 - 1))
    # the other rank: a batch with loss 3.0 over 10 samples (state 30, 10), the epoch with 2.0 over 40 (80, 40)
    other = np.array([3.0, 30.0, 10.0, 30.0, 10.0, 2.0, 80.0, 40.0, 80.0, 40.0, 0.0, h, h * h])
    reducer = Reducer(HandBuiltPeer(other), "exact")
    mean = lambda s: {"loss": s[0] / s[1]}  # noqa: E731
    batch = Part({"loss": 1.0}, (MetricState("", np.array([10.0, 10.0]), 10.0, mean),))
    epoch = Part({"loss": 0.5}, (MetricState("", np.array([20.0, 40.0]), 40.0, mean),), {"rank0_step": 7.0})
    before, out = reducer.reduce_all([batch, epoch], "t")
    assert before.values == {"loss": pytest.approx(40 / 20)}
    assert out.values == {"loss": pytest.approx(100 / 80)} and out.carried == {"rank0_step": 7.0}
    other[-2:] = [h + 1, (h + 1) ** 2]  # the other rank's layout differs: the gather that names the keys runs
    with pytest.raises(MetricKeyMismatchError, match=r"cannot be gathered \(AttributeError\)"):  # (it has none)
        Reducer(HandBuiltPeer(other), "exact").reduce_all([batch, epoch], "t")


def test_the_collective_that_shows_every_rank_ready_switches_its_own_results_to_compiled():
    """Whether the results from summed states run compiled is read from the same collective's sum of every rank's
    readiness (tracing.READY_KEY), before they are computed: the same on every rank, never a rank's own thread."""
    calls = []

    class Source:
        def many(self, summed, compiled=False, healthy=True):
            calls.append("compiled" if compiled else "eager")
            return [{"loss": s[0] / s[1]} for s in summed]

    class OtherRankAlike(Solo):
        """Rank 0 of 2, the other rank's vector the same but for its readiness (the last value it carries)."""

        size, other_ready = 2, 0.0

        def allreduce_sum(self, values, name):
            other = values.copy()
            other[-3] = self.other_ready  # [..., carry..., signature, signature^2]
            return values + other

    comm = OtherRankAlike()
    reducer = Reducer(comm, "exact")
    for mine, others, expected in ((1.0, 0.0, "eager"), (1.0, 1.0, "compiled"), (0.0, 0.0, "compiled")):
        comm.other_ready = others
        state = MetricState("", np.array([30.0, 10.0]), 10.0, lambda s: {"loss": s[0] / s[1]}, source=Source())
        values = reducer.reduce_all([Part({"loss": 3.0}, (state,), {tracing.READY_KEY: mine})], "epoch")[0].values
        assert calls[-1] == expected and values == {"loss": 3.0}  # (30+30)/(10+10) either way
    assert reducer.agreement.compiled  # agreed once: not undone by a later sum
