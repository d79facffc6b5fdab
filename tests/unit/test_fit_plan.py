"""The train-begin agreement, with a fake allgather that hands every rank the proposals we write here."""

from __future__ import annotations

import pytest

from hvd_mlflow.errors import HvdMlflowError, OptionsMismatchError
from hvd_mlflow.fit_plan import Proposal, agree


class Gathered:
    """Two ranks' collective: ``allgather_object`` returns the proposals of both ranks, in rank order."""

    size = 2

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
