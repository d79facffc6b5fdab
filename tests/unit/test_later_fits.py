"""Where a later fit of this process logs in a run an earlier fit logged into (every_rank/later_fits.py)."""

from __future__ import annotations

import uuid

from hvd_mlflow.every_rank import later_fits
from hvd_mlflow.every_rank.later_fits import Offsets


def fresh_run() -> str:
    return uuid.uuid4().hex


def test_a_first_fit_is_not_moved():
    offsets = Offsets.after(later_fits.recalled(fresh_run()), first_step=0)
    assert not offsets.later_fit and offsets.epoch(0, 0) == 0 and offsets.batch(6) == 6


def test_a_second_fit_from_epoch_0_with_a_new_optimizer_follows_the_first():
    run = fresh_run()
    later_fits.remember(run, last_epoch=2, last_batch=18, first_epoch=0)  # 3 epochs of 6 steps
    offsets = Offsets.after(later_fits.recalled(run), first_step=0)  # compiled again: the optimizer counts from 0
    assert [offsets.epoch(e, 0) for e in range(2)] == [3, 4]
    assert offsets.batch(2) == 20  # after the first fit's last batch step
    assert later_fits.recalled(run).fit_starts == (0,)


def test_a_fit_that_continues_is_not_moved():
    run = fresh_run()
    later_fits.remember(run, last_epoch=2, last_batch=18, first_epoch=0)
    offsets = Offsets.after(later_fits.recalled(run), first_step=18)  # the same optimizer, still counting
    assert [offsets.epoch(e, 3) for e in (3, 4)] == [3, 4]  # fit(initial_epoch=3)
    assert offsets.batch(20) == 20


def test_what_is_remembered_never_goes_back_and_runs_are_apart():
    run, other = fresh_run(), fresh_run()
    later_fits.remember(run, last_epoch=4, last_batch=30, first_epoch=3)
    later_fits.remember(run, last_epoch=1, last_batch=None)
    assert later_fits.recalled(run) == later_fits.Logged(4, 30, (3,))
    assert later_fits.recalled(other) is None and later_fits.recalled(None) is None
