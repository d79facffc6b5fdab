"""The train-begin agreement, with a fake allgather that hands every rank the proposals we write here."""

from __future__ import annotations

import logging

import pytest

from hvd_mlflow import _log
from hvd_mlflow.config import Options
from hvd_mlflow.errors import HvdMlflowError, OptionsMismatchError
from hvd_mlflow.every_rank import keras_flavour
from hvd_mlflow.every_rank.fit_plan import Proposal, agree, batch_clock, collective_shape


class Gathered:
    """Two ranks' collective: ``allgather_object`` returns the proposals of both ranks, in rank order."""

    size = 2
    engine = "horovod"
    values_are_global = False  # Horovod's: the processes' samples and batch sizes may differ, not their steps

    def __init__(self, rank: int, proposals: list[Proposal]) -> None:
        self.rank = rank
        self.proposals = proposals
        self.calls = 0

    def allgather_object(self, obj, name):
        assert obj == self.proposals[self.rank]  # each rank contributes its own proposal
        self.calls += 1
        return self.proposals


OPTIONS = (("reduction", "exact"), ("log_every_n_steps", 4), ("rank_spread", ()))


def test_every_rank_takes_rank_0s_run_and_first_step_in_one_collective():
    proposals = [Proposal("run-1", True, 110, OPTIONS), Proposal(None, False, 0, OPTIONS)]
    for rank in (0, 1):
        comm = Gathered(rank, proposals)
        plan = agree(comm, proposals[rank])
        assert (plan.run_id, plan.owns_run, plan.first_step) == ("run-1", True, 110)
        assert comm.calls == 1


def test_elastic_params_kept_from_the_first_fit_win_over_a_new_rank_0_s_own():
    """After a reset a process that joined later may be rank 0: its own params (its world, its epochs left) are not
    the run's. Every rank takes the first params kept from the first fit, in rank order; else rank 0's own."""
    first = {"world_size": "2", "epochs": "8"}
    joined = {"world_size": "1", "epochs": "6"}
    proposals = [Proposal(None, False, 0, OPTIONS, params=joined), Proposal(None, False, 0, OPTIONS, params=first,
                                                                            params_kept=True)]  # fmt: skip
    assert {agree(Gathered(rank, proposals), proposals[rank]).params["world_size"] for rank in (0, 1)} == {"2"}
    fresh = [Proposal(None, False, 0, OPTIONS, params=first), Proposal(None, False, 0, OPTIONS)]  # the first fit
    assert [agree(Gathered(rank, fresh), fresh[rank]).params for rank in (0, 1)] == [first, first]


def test_different_options_raise_the_same_error_on_every_rank():
    other = (("reduction", "exact"), ("log_every_n_steps", 0), ("rank_spread", ()))
    proposals = [Proposal("r", False, 0, OPTIONS), Proposal(None, False, 0, other)]
    messages = []
    for rank in (0, 1):
        with pytest.raises(OptionsMismatchError) as raised:
            agree(Gathered(rank, proposals), proposals[rank])
        assert isinstance(raised.value, HvdMlflowError)
        messages.append(str(raised.value))
    assert messages[0] == messages[1]
    assert "rank 1: reduction='exact', log_every_n_steps=0" in messages[0]


def test_horovod_ranks_with_different_training_steps_raise_the_same_line_on_every_rank_validation_may_differ():
    from hvd_mlflow.errors import ShardMismatchError
    from hvd_mlflow.every_rank.shards import Batches

    mine = Batches(training=64, validation=24, batch_size=16, steps=4, validation_steps=2)
    alike = [Proposal(None, False, 0, OPTIONS, batches=b) for b in (mine, Batches(48, 8, 12, steps=4))]
    assert [agree(Gathered(rank, alike), alike[rank]).first_step for rank in (0, 1)] == [0, 0]  # samples may differ
    unequal = [Proposal(None, False, 0, OPTIONS, batches=b) for b in (mine, Batches(48, 24, 16, steps=3))]
    messages = set()
    for rank in (0, 1):
        with pytest.raises(ShardMismatchError) as raised:
            agree(Gathered(rank, unequal), unequal[rank])
        messages.add(str(raised.value))
    [message] = messages
    assert "(rank 0: 4, rank 1: 3)" in message and "\n" not in message
    unknown = [Proposal(None, False, 0, OPTIONS, batches=b) for b in (mine, Batches(steps=None))]  # not judged
    assert agree(Gathered(0, unknown), unknown[0]).first_step == 0


def compiled(steps_per_execution):
    """A Keras model of the flavour under test, compiled with ``steps_per_execution`` (no fit needed)."""
    import tensorflow as tf

    keras = tf.keras
    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
    return model


def test_the_collective_shape_is_the_options_and_the_compiled_steps_per_execution():
    """What the ranks compare at train begin: a rank compiled with another steps_per_execution runs its batch
    hooks (and so its batch collectives) at other batches, so it must show in the agreed shape."""
    options = Options(log_every_n_steps=4, rank_spread=("loss",))
    three = collective_shape(options, compiled(3))
    assert three == (*options.collective(), ("steps_per_execution", 3))
    assert dict(three)["log_every_n_steps"] == 4 and dict(three)["rank_spread"] == ("loss",)
    assert collective_shape(options, compiled(1)) != three
    assert collective_shape(Options(log_every_n_steps=2), compiled(3)) != three


def test_the_batch_clock_starts_at_the_agreed_step_and_interval():
    plan = Proposal("run-1", True, 110, (), log_every_n_steps=4)
    clock = batch_clock(plan, compiled(2), warn=True)
    assert (clock.every, clock._anchor, clock._per_execution) == (4, 110, 2)


def test_a_self_tuned_steps_per_execution_turns_batch_logging_off_on_every_rank(caplog, monkeypatch):
    """steps_per_execution="auto" (tf_keras / Keras 2) lets each rank tune it on its own clock: batch logging is
    off for the fit on every rank alike (the model's compile arguments), and rank 0 says so once."""
    caplog.set_level(logging.WARNING, "hvd_mlflow")
    monkeypatch.setattr(_log, "_said", set())  # whatever this process said before
    try:
        model = compiled("auto")
    except (TypeError, ValueError):
        pytest.skip("this Keras has no self-tuned steps_per_execution")
    if not keras_flavour.steps_per_execution_is_tuned(model):
        pytest.skip("this Keras has no self-tuned steps_per_execution")
    plan = Proposal("run-1", True, 0, (), log_every_n_steps=4)
    assert dict(collective_shape(Options(log_every_n_steps=4), model))["steps_per_execution"] == "auto"
    quiet = batch_clock(plan, model, warn=False)  # another rank
    said = batch_clock(plan, model, warn=True)  # rank 0
    assert quiet.every == said.every == 0
    assert sum("log_every_n_steps is off" in r.getMessage() for r in caplog.records) == 1


def test_the_run_id_rides_as_numbers_until_every_rank_has_it():
    from hvd_mlflow.every_rank.fit_plan import run_id_carry, run_id_from_carried

    run_id = "0123456789abcdef0fedcba987654321"
    rank0, rank1 = run_id_carry(run_id, 0, logging=True), run_id_carry(None, 1, logging=False)
    assert rank0.keys() == rank1.keys() and set(rank1.values()) == {0.0}  # the same layout on every rank
    summed = {k: rank0[k] + rank1[k] for k in rank0}
    assert run_id_from_carried(summed) == (True, run_id, False)
    assert run_id_from_carried(run_id_carry(None, 0, logging=True)) == (False, None, False)  # not yet: again
    assert run_id_from_carried(run_id_carry(None, 0, logging=False)) == (True, None, False)  # rank 0 not logging
    # not 32 hex digits: every rank takes it from rank 0 in one broadcast
    assert run_id_from_carried(run_id_carry("job-7_abc", 0, logging=True)) == (True, None, True)
