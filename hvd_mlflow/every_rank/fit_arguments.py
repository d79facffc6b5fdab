"""What :func:`hvd_mlflow.autolog` hands the callback from ``fit``'s arguments, and what each rank brings from them
to the train-begin agreement (:mod:`hvd_mlflow.every_rank.fit_plan`): every rank alike.

A mixin on :class:`hvd_mlflow.HorovodMlflowCallback`: it works on the callback's state.

    callback._set_fit_arguments(batch_size=32, empty_shards=(), batches=shards.batches(arguments, 32))
    plan = fit_plan.agree(comm, callback._proposal(first_step=0, every=0, logged=None))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..common import topology
from . import fit_plan, shards
from .later_fits import Logged


class FitArguments:
    """``fit``'s arguments as autolog reads them on each rank, and this rank's train-begin proposal."""

    model: Any
    options: Any
    params: Mapping[str, Any]
    run_id: str | None
    _owns_run: bool

    def _set_fit_arguments(
        self,
        batch_size: int | None,
        empty_shards: tuple[str, ...] = (),
        folders: Sequence[Any] = (),  # delivery.folder_artifacts.FolderUpload (rank 0 uploads them)
        batches: shards.Batches | None = None,
    ) -> None:
        self._batch_size = batch_size
        self._empty_shards = empty_shards
        self._batches = batches or shards.Batches()
        self._folders = tuple(folders)  # rank 0: what of TensorBoard's folders to upload at the end
        self._ends_after_fit = True

    def _proposal(self, first_step: int, every: int, logged: Logged | None) -> fit_plan.Proposal:
        """What this rank brings to the train-begin agreement (rank 0: its run, first step, batch interval and what
        its process logged before; every rank: the options that shape collectives, its host, its data)."""
        params, kept = self._proposed_params()  # RankZeroSteps': under elastic, the run's params
        steps = (getattr(self, "params", None) or {}).get("steps")  # Keras' count of this rank's training steps
        return fit_plan.Proposal(
            self.run_id,
            self._owns_run,
            first_step,
            fit_plan.collective_shape(self.options, self.model),
            every,
            topology.hostname(),
            self._empty_here(steps),
            params=params,
            batches=dataclasses.replace(self._batches, steps=steps),
            params_kept=kept,
            logged=logged,
        )

    def _empty_here(self, steps: int | None) -> tuple[str, ...]:
        """This rank's empty shards, for the train-begin proposal: from fit's arguments, or Keras' own count of
        training ``steps`` (0: nothing to train on). Agreed there: any rank's raises on every rank."""
        empty = set(self._empty_shards)
        if steps == 0:
            empty.add(shards.TRAINING)
        return tuple(part for part in (shards.TRAINING, shards.VALIDATION) if part in empty)

    def _train_begin_without_fit(self, model: Any, epochs: Any) -> None:
        """A rank with no training data, which Keras would refuse on this rank alone (tf_keras before any callback):
        instead of ``fit``, this rank's part of the train-begin agreement, which raises the same error on every
        rank."""
        self.set_model(model)  # Keras' Callback
        self.set_params({"epochs": epochs, "steps": 0, "verbose": 0})
        self.on_train_begin()
