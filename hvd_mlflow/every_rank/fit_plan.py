"""What every rank agrees on at train begin, in one collective, before any other collective of the fit.

Rule 2 of this code base: every decision that changes which collectives a rank calls is the same on every rank by
construction. At train begin each rank brings a :class:`Proposal`: rank 0 the run (which it alone resolved), the
global step it starts from (its optimizer's iteration count: with Horovod's resume recipe only rank 0 has
restored it yet), the steps its process logged into the run in earlier fits (a later fit starts after them:
:mod:`hvd_mlflow.every_rank.later_fits`) and the batch-logging interval (raised to keep within the server's rows
per metric), every rank the options that shape the collectives. One ``allgather_object`` gives every rank every
proposal, so every rank takes rank 0's run, first step and interval (and rank 0 learns every rank's host), and
every rank sees whether the ranks' options differ, whether any rank's training or validation shard is empty, or
whether their batches cannot go together (:mod:`hvd_mlflow.every_rank.shards`), and raises the same error if so
(never a hang, never one rank alone). The batch clock follows from the agreed plan
and the compile arguments, which every rank has alike.

A run rank 0's sender creates is not waited for at train begin (MLflow is imported and the run made once the first
epoch has ended: :mod:`hvd_mlflow.delivery.sender`): its id rides in the epoch collectives, as numbers
(:func:`run_id_carry`), until every rank has it (:func:`run_id_from_carried`); whether it rides is itself agreed,
so every rank carries the same keys.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .._log import warn_once
from ..errors import EmptyShardError, OptionsMismatchError, ShardMismatchError
from . import keras_flavour
from .batch_steps import BatchClock
from .collectives import Collectives
from .later_fits import Logged
from .shards import Batches, unequal, unequal_message, unequal_steps, unequal_steps_message
from .shards import message as empty_shards_message


@dataclasses.dataclass(frozen=True)
class Proposal:
    run_id: str | None  # rank 0's; None elsewhere
    owns_run: bool  # hvd-mlflow creates (or created) the run: whoever is rank 0 at the end ends it
    first_step: int  # rank 0's optimizer iterations at train begin; 0 elsewhere
    collective_options: tuple[tuple[str, Any], ...]  # (name, value) of every option that shapes collectives
    log_every_n_steps: int = 0  # rank 0's, raised to keep the batch/ rows within the server's limit
    host: str = ""  # this rank's host name (rank 0 tags the run with every rank's)
    empty: tuple[str, ...] = ()  # which of this rank's shards are empty (training, validation): any is an error
    # elastic: the run's params, kept from the training's first fit (``params_kept``), else rank 0's own now
    params: Mapping[str, str] | None = None
    params_kept: bool = False
    logged: Logged | None = None  # rank 0: what this process logged into the run before (a later fit moves on)
    batches: Batches = Batches()  # what this rank's batches are made of (keras.distribution needs them alike)
    hosts: tuple[str, ...] = ()  # agreed (in the plan :func:`agree` returns): every rank's host, in rank order


def collective_shape(options: Any, model: Any) -> tuple[tuple[str, Any], ...]:
    """The options that shape collectives, and ``steps_per_execution`` (a compile argument: alike on every rank)."""
    tuned = keras_flavour.steps_per_execution_is_tuned(model)
    return (
        *options.collective(),
        ("steps_per_execution", "auto" if tuned else keras_flavour.steps_per_execution(model)),
    )


def batch_clock(plan: Proposal, model: Any, *, warn: bool) -> BatchClock:
    """The fit's batch clock: the agreed first step and interval, off when ``steps_per_execution="auto"``."""
    every = plan.log_every_n_steps
    if every and keras_flavour.steps_per_execution_is_tuned(model):  # each rank would tune it on its own clock
        every = 0
        if warn:
            warn_once(
                "tuned-steps",
                "hvd-mlflow: log_every_n_steps is off for this fit: steps_per_execution="
                "'auto' lets each rank tune it on its own, so ranks cannot agree on batches; give a number",
            )
    return BatchClock(plan.first_step, every, keras_flavour.steps_per_execution(model))


def agree(comm: Collectives, proposal: Proposal) -> Proposal:
    """Every rank's proposal, exchanged; the plan: rank 0's proposal (its run, first step, interval, what its process
    logged before) with every rank's host, and under elastic the params kept (the first in rank order, else rank
    0's). Raises on every rank if options differ."""
    proposals: Sequence[Proposal] = comm.allgather_object(proposal, name="hvd_mlflow.train_begin")  # Solo: [proposal]
    reference = proposals[0].collective_options
    different = [(rank, p.collective_options) for rank, p in enumerate(proposals) if p.collective_options != reference]
    if different:
        lines = [f"  rank 0: {_describe(reference)}"] + [f"  rank {r}: {_describe(o)}" for r, o in different]
        raise OptionsMismatchError(
            "hvd-mlflow: ranks were given different options that decide which collectives every rank runs, so "
            "they would wait for each other forever; give every rank the same (same code, same HVD_MLFLOW_* "
            "variables):\n" + "\n".join(lines)
        )
    empty = {rank: p.empty for rank, p in enumerate(proposals) if p.empty}
    if empty:  # one rank's own data, now known to every rank: the same error everywhere
        raise EmptyShardError(empty_shards_message(empty))
    by_rank = [p.batches for p in proposals]
    if comm.values_are_global and unequal(by_rank):  # JAX joins the processes' batches
        raise ShardMismatchError(unequal_message(by_rank))
    if comm.engine == "horovod" and unequal_steps(by_rank):  # each training step averages the ranks' gradients
        raise ShardMismatchError(unequal_steps_message(by_rank))
    leader = proposals[0]
    kept = [p.params for p in proposals if p.params_kept and p.params is not None]
    return dataclasses.replace(
        leader, hosts=tuple(p.host for p in proposals), params=kept[0] if kept else leader.params
    )


def _describe(options: tuple[tuple[str, Any], ...]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in options)


_HEX_RUN_ID = re.compile(r"[0-9a-f]{32}")
_WORDS = 4  # a 32-hex-digit run id as four 32-bit numbers: exact in float64, so their sum over ranks is rank 0's
RUN_ID_KEYS = ("run_id_state", *(f"run_id_{i}" for i in range(_WORDS)))
# run_id_state: known (the words hold it), known but not 32 hex digits (every rank then takes it from rank 0 in one
# broadcast), not known yet (carried again), never (rank 0 does not log)
KNOWN, KNOWN_OTHER, UNKNOWN_YET, NEVER = 1.0, 2.0, 0.0, -1.0


def run_id_carry(run_id: str | None, rank: int, logging: bool) -> dict[str, float]:
    """What a rank carries of the run id (the same keys on every rank): rank 0 its run's id once its sender knows
    it (``NEVER`` when it does not log); the others zeros."""
    words = [0.0] * _WORDS
    state = UNKNOWN_YET
    if rank == 0:
        if not logging:
            state = NEVER
        elif run_id is not None:
            state = KNOWN if _HEX_RUN_ID.fullmatch(run_id) else KNOWN_OTHER
            if state == KNOWN:
                words = [float(int(run_id[8 * i : 8 * i + 8], 16)) for i in range(_WORDS)]
    return dict(zip(RUN_ID_KEYS, [state if rank == 0 else 0.0, *words], strict=True))


def run_id_from_carried(carried: Mapping[str, float]) -> tuple[bool, str | None, bool]:
    """From the epoch collective's sums, alike on every rank: whether to stop carrying it, the run id, and whether
    every rank must take it from rank 0 in a broadcast (an id that is not 32 hex digits)."""
    state = carried.get("run_id_state", NEVER)
    if state == KNOWN:
        return True, "".join(f"{int(carried[f'run_id_{i}']):08x}" for i in range(_WORDS)), False
    return state in (NEVER, KNOWN_OTHER), None, state == KNOWN_OTHER
