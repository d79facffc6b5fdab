"""When batch values are logged: the same on every rank, from Keras' batch indices and an agreed first step."""

from __future__ import annotations

import pytest

from hvd_mlflow.every_rank.batch_steps import BatchClock


def run(clock: BatchClock, indices_per_epoch: list[list[int]]) -> list[int]:
    logged = []
    for indices in indices_per_epoch:
        clock.epoch_begins()
        logged += [s for s in (clock.after_batch(b) for b in indices) if s is not None]
    return logged


def test_every_n_global_steps_from_the_agreed_first_step():
    # 2 epochs of 6 batches, resumed at iteration 10: global steps 11..22, multiples of 4: 12, 16, 20
    clock = BatchClock(first_step=10, every=4)
    assert run(clock, [list(range(6))] * 2) == [12, 16, 20]
    assert clock.step == 22


@pytest.mark.parametrize(
    "indices",
    [[0, 2, 4], [1, 3, 5]],  # Keras 3 passes each execution's first index, tf_keras / Keras 2 its last
)
def test_steps_per_execution_in_both_keras_flavours(indices):
    clock = BatchClock(first_step=0, every=4, per_execution=2)
    assert run(clock, [indices] * 4) == [4, 8, 12, 16, 20, 24]


def test_an_execution_that_crosses_a_multiple_logs_where_it_ended():
    # k=3, N=4: executions end at 3, 6, 9, 12; they cross 4, 8 and reach 12
    clock = BatchClock(first_step=0, every=4, per_execution=3)
    assert run(clock, [[0, 3, 6, 9]]) == [6, 9, 12]


def test_the_epoch_end_anchor_corrects_a_count_keras_could_not_tell():
    # Keras 3 with 7 batches and k=3: the last execution runs out of data and its hook is never called, so the
    # count sees 6 batches; the anchor (rank 0's optimizer: 7) puts the next epoch right
    clock = BatchClock(first_step=0, every=3, per_execution=3)
    assert run(clock, [[0, 3]]) == [3, 6]
    clock.anchor(7)
    assert run(clock, [[0, 3]]) == [10, 13]  # crossing 9 and 12, at the steps the executions really ended
    clock.anchor(14)
    assert clock.step == 14


def test_the_index_semantics_is_learned_per_epoch():
    # Keras 3 with data of unknown length: the first epoch passes last indices (k-1, ...), later ones first indices
    clock = BatchClock(first_step=0, every=2, per_execution=2)
    assert run(clock, [[1, 3, 5], [0, 2, 4]]) == [2, 4, 6, 8, 10, 12]


def test_off():
    clock = BatchClock(first_step=0, every=0)
    assert run(clock, [[0, 1, 2]]) == []
