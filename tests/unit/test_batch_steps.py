"""When batch values are logged: the same on every rank, from Keras' batch indices and an agreed first step."""

from __future__ import annotations

import pytest

from hvd_mlflow.batch_steps import BatchClock


def run(clock: BatchClock, indices_per_epoch: list[list[int]]) -> list[int]:
    logged = []
    for indices in indices_per_epoch:
        clock.epoch_begins()
        logged += [s for s in (clock.after_batch(b) for b in indices) if s is not None]
    return logged


def test_every_n_global_steps_from_the_agreed_first_step():
    # 2 epochs of 6 batches, resumed at iteration 10: global steps 11..22, multiples of 4: 12, 16, 20
    clock = BatchClock(first_step=10, every=4, per_execution=1, index_is_first=False, steps_per_epoch=6)
    assert run(clock, [list(range(6))] * 2) == [12, 16, 20]
    assert clock.step == 22


@pytest.mark.parametrize(
    "index_is_first, indices",
    [(True, [0, 2, 4]), (False, [1, 3, 5])],  # Keras 3 passes each execution's first index, tf_keras its last
)
def test_steps_per_execution_in_both_keras_flavours(index_is_first, indices):
    clock = BatchClock(first_step=0, every=4, per_execution=2, index_is_first=index_is_first, steps_per_epoch=6)
    assert run(clock, [indices] * 4) == [4, 8, 12, 16, 20, 24]


def test_an_execution_that_crosses_a_multiple_logs_where_it_ended():
    # k=3, N=4: executions end at 3, 6, 9, 12; they cross 4, 8 and reach 12
    clock = BatchClock(first_step=0, every=4, per_execution=3, index_is_first=True, steps_per_epoch=12)
    assert run(clock, [[0, 3, 6, 9]]) == [6, 9, 12]


def test_a_short_last_execution_of_keras3_is_not_counted_past_the_epoch():
    # 7 batches, k=3: Keras 3 passes 0, 3, 6; the last execution ran one batch only
    clock = BatchClock(first_step=0, every=7, per_execution=3, index_is_first=True, steps_per_epoch=7)
    assert run(clock, [[0, 3, 6]] * 2) == [7, 14]


def test_unknown_epoch_length_uses_the_last_index():
    clock = BatchClock(first_step=0, every=2, per_execution=2, index_is_first=True, steps_per_epoch=None)
    assert run(clock, [[1, 3, 5]]) == [2, 4, 6]


def test_off():
    clock = BatchClock(first_step=0, every=0, per_execution=1, index_is_first=False, steps_per_epoch=3)
    assert run(clock, [[0, 1, 2]]) == []
