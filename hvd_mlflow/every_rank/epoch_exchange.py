"""What rides in the epoch's (and a logged batch's) collective, on every rank alike: the metric states (the training
state kept before validation resets it), and besides them rank 0's optimizer step (the batch clock's anchor), the
samples of ``reduction="mean"``, the weights' fingerprint (:mod:`hvd_mlflow.every_rank.divergence`),
the ranks' system metrics (:mod:`hvd_mlflow.every_rank.system_metrics`); and what every rank reads back from it. The
same keys on every rank, whatever each rank could compute (NaN then): the collective's layout never depends on one rank.

Also what :func:`hvd_mlflow.autolog` hands the callback from ``fit``'s arguments, and what each rank brings from them
to the train-begin agreement (:mod:`hvd_mlflow.every_rank.fit_plan`): every rank alike::

    callback._set_fit_arguments(batch_size=32, empty_shards=(), batches=shards.batches(arguments, 32))
    plan = fit_plan.agree(comm, callback._proposal(first_step=0, every=0, logged=None))
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .._log import warn_once
from ..common import topology
from . import divergence, fit_plan, keras_flavour, metric_state, run_params, shards, tracing
from .aggregate import Part, Reduced
from .later_fits import Logged
from .system_metrics import summary as system_summary

Point = tuple[int, int, dict[str, float]]  # a journaled point: step, timestamp_ms, values


class EpochExchange:
    """What :class:`hvd_mlflow.HorovodMlflowCallback` puts into its collectives and reads back from them, on every
    rank (a mixin on the callback); also the system-metrics sampler whose epoch means ride there, and ``fit``'s
    arguments as autolog reads them on each rank, with this rank's train-begin proposal."""

    model: Any
    options: Any
    params: Mapping[str, Any]
    run_id: str | None
    _owns_run: bool

    def _needs_states(self) -> bool:
        """Whether the collectives carry metric states (not for ``reduction="mean"``), or this rank's own values must
        be computed from them (an engine whose logs are global already: tf.distribute). Only TensorFlow's variables
        are read (metric_state.py): a model on another backend has Keras' values only (global already where an
        engine makes them so, their own in one process)."""
        if not keras_flavour.runs_on_tensorflow(self.model):
            return False
        return self.options.reduction != "mean" or self._comm.logs_are_global

    def _batch_points(self, kept: Sequence[tuple[int, int, Part]], results: Sequence[Reduced]) -> list[Point]:
        """Every rank: the logged batches' ``(step, timestamp_ms, values)`` under their ``batch/`` names, kept for
        an elastic replay."""
        points = []
        for (step, timestamp_ms, _), reduced in zip(kept, results, strict=True):
            logged = self._named(reduced, prefix="batch/")
            if self._elastic is not None:  # every rank keeps it: any of them may be rank 0 after a reset
                self._elastic.link.remember_batch(step, timestamp_ms, logged)
            points.append((step, timestamp_ms, logged))
        return points

    def _named(self, reduced: Reduced, prefix: str = "") -> dict[str, float]:
        """A reduced part's values and rank spread under the names the server takes (``prefix``: ``batch/``), on
        every rank: a collision raises on every rank."""
        values = {prefix + k: v for k, v in {**reduced.values, **reduced.spread}.items()}
        names = self._metric_names(values)
        return {names[k]: v for k, v in values.items()}

    def _keep_train_state(self) -> None:
        """Before fit's validation resets the metrics: keep the training state (and, for ``mean``, the samples)."""
        self._validating = True
        if self._needs_states():
            self._train_state = metric_state.capture(self.model, prefix="")
        if self.options.reduction == "mean":
            self._train_samples = metric_state.samples(self.model)
        elif not keras_flavour.runs_on_tensorflow(self.model):
            self._train_samples = self._keras_samples()

    def _keras_samples(self) -> float:
        """Off TensorFlow (no metric states ride in the collective): the training samples as Keras' loss tracker
        counts them, global under keras.distribution (its state is one array over the processes), 0 if unknown."""
        count = next((m.count for m in metric_state.leaf_metrics(self.model) if m.name == "loss"
                      and hasattr(m, "count")), None)  # fmt: skip
        return keras_flavour.read_scalar(count) if count is not None else 0.0

    def _epoch_states(self) -> list[metric_state.MetricState]:
        """The states the epoch's results come from: training and validation, or training alone (a logged batch's
        too: during the training batches); those that exist (none for ``reduction="mean"``, nor for a model without
        built metrics)."""
        if not self._needs_states():
            return []
        if not self._validating:
            states = [metric_state.capture(self.model, prefix="")]
        else:
            states = [self._train_state, metric_state.capture(self.model, prefix="val_")]
        return [s for s in states if s is not None]

    def _stop_sampler(self) -> None:
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop()

    def _not_additive_keys(self) -> set[str]:
        """The result keys (train and ``val_``) of metrics whose state does not add up: found once per fit, when
        the metrics are built, on every rank alike (from the model)."""
        if self._not_additive is None:
            exact = self.options.reduction == "exact" and self._needs_states()
            keys = metric_state.inexact_keys(self.model) if exact else set()
            self._not_additive = keys | {f"val_{k}" for k in keys}
        return self._not_additive

    def _learn_run_id(self, reduced: Reduced) -> None:
        """After the epoch's collective, on every rank: the run id rank 0 carried in it, if it did."""
        if self._run_agreed:
            return
        self._run_agreed, run_id, broadcast = fit_plan.run_id_from_carried(reduced.carried)
        if broadcast:  # agreed in the collective: every rank calls it
            run_id = self._comm.broadcast_object(self._carried_run_id, name="hvd_mlflow.run_id")
        if run_id is not None:
            self.run_id = run_id
            if self._elastic is not None:
                self._elastic.agreed_run(run_id, False)

    def _trace_ahead(self, epoch: int) -> None:
        """At the first epoch's end, on every rank: trace hvd-mlflow's per-epoch functions in the background, when
        at least two more epochs follow (from Keras' params: alike on every rank)."""
        epochs = (getattr(self, "params", None) or {}).get("epochs") or 0
        if self._traced is not None or epoch + 2 >= epochs:
            return
        traced = []
        if self.options.reduction == "exact" and self._needs_states():
            traced.append(metric_state.trace_in_background(self.model, states=2 if self._validating else 1))
        if self._checks_divergence():
            traced.append(divergence.trace_in_background(self.model))
        self._traced = [t for t in traced if t is not None]

    def _checks_divergence(self) -> bool:
        """Whether the epoch collective carries the weights' fingerprint: asked for, several ranks, and an engine that
        does not keep the weights equal by itself (tf.distribute's mirrored variables do: nothing to check)."""
        return self.options.check_divergence and self._comm.size > 1 and not self._comm.keeps_weights_in_step

    def _ranks_health(self, reduced: Reduced) -> dict[str, float]:
        """From the epoch's collective, alike on every rank: whether the ranks' weights differ (every rank warns
        once), and the ranks' system metrics; what rank 0 logs of it."""
        out: dict[str, float] = {}
        carried = reduced.carried
        if self._checks_divergence() and "fp_abs" in carried:
            value = divergence.spread(carried, self._comm.size)
            if self._diverged_at is None and value > divergence.TOLERANCE:
                self._diverged_at = self._step
                warn_once(f"diverged:{id(self)}:{self._step}", divergence.warning(self._step, value))
                if self._logging:
                    with self._rank0.step("recording the divergence"):
                        self._run_logger.log_tags({divergence.TAG: str(self._step)})
            if self._diverged_at is not None:
                out[divergence.METRIC] = value
        if self.options.system_metrics:
            per_rank = {k[4:]: v for k, v in reduced.carried_per_rank.items() if k.startswith("sys_")}
            out.update(system_summary(per_rank))
        return out

    def _epoch_dynamics(self, reduced: Reduced) -> dict[str, float]:
        """Every rank's per-epoch extras, after the epoch's collective (when every rank has reached its end): the
        epoch's wall time, global training samples per second, the optimizer's learning rate. Every rank computes
        them (its clock measures the same collective's end, its optimizer is the same as rank 0's), so that after
        an elastic reset the new rank 0 replays them with the epoch's values. What cannot be read is left out (rank
        0 warns once); nothing here decides a collective."""
        seconds = time.perf_counter() - self._epoch_start
        out = {"epoch_time_s": seconds}
        try:
            samples = reduced.train_samples or reduced.carried.get("train_samples")
            if not samples and not keras_flavour.runs_on_tensorflow(self.model):  # Keras' own count (one process,
                samples = self._train_samples if self._validating else self._keras_samples()  # or global already)
            if samples and seconds > 0 and not self._counts_batches(samples):
                out["samples_per_s"] = samples / seconds
            rate = run_params.current_learning_rate(self.model)
            if rate is not None:
                out["learning_rate"] = rate
        except Exception as error:  # noqa: BLE001 - an optimizer or model of the user's own: the epoch goes on
            if self._comm.rank == 0:
                warn_once(f"dynamics:{id(self)}", "hvd-mlflow: %s: %s (the throughput or learning rate is not "
                          "logged)", type(error).__name__, error)  # fmt: skip
        return out

    def _counts_batches(self, samples: float) -> bool:
        """Whether the loss tracker's count, summed over ranks, is the epoch's batches rather than its samples: a
        custom ``train_step`` that updates its own ``Mean(name="loss")`` without a sample weight (Keras' own
        example does) counts one per batch. Then ``samples_per_s`` would be batches per second: it is not logged,
        with one warning (rank 0's). (With a batch size of 1 the two are the same and it is logged.)"""
        steps = (getattr(self, "params", None) or {}).get("steps")
        if not steps or self._batch_size == 1 or samples != steps * self._comm.size:
            return False
        own_step = type(self.model).train_step is not keras_flavour.model_class(self._flavour or "keras").train_step
        if not own_step:  # Keras' train_step counts samples: batches of one sample (a dataset batched by 1)
            return False
        if self._comm.rank == 0:
            warn_once(
                f"counts-batches:{id(self)}",
                "hvd-mlflow: the loss tracker counts batches, not samples (%d over %d ranks, %s steps each): a "
                "custom train_step that calls loss_tracker.update_state(loss) without sample_weight. samples_per_s "
                "is not logged; pass sample_weight=batch size to update_state to have it.",
                int(samples),
                self._comm.size,
                steps,
            )
        return True

    def _epoch_carry(self) -> dict[str, float]:
        """What rides in the epoch's collective besides the metrics (the same keys on every rank)."""
        # whether this rank's traced functions are ready, and none of its compiled calls failed (agreed: tracing.py)
        carry = tracing.Agreement.carry(self._traced, metric_state.healthy(self.model))
        if self._checks_divergence():  # every rank: its weights' fingerprint (or NaN)
            try:
                carry.update(divergence.carry(self.model, self._reducer.agreement.compiled))
            except Exception:  # noqa: BLE001 - the collective's layout stays the same on every rank
                carry.update(dict.fromkeys(divergence.CARRIED, math.nan))
        if self.options.system_metrics:
            carry.update({f"sys_{k}": v for k, v in self._sampler.epoch_means().items()})
        if self._clock.every > 0:  # rank 0's optimizer step (the others carry 0): the step every rank agrees on
            step = math.nan
            if self._comm.rank == 0:
                with self._rank0.step("reading the optimizer's step"):
                    step = float(run_params.optimizer_iterations(self.model) or math.nan)
            carry["rank0_step"] = step if self._comm.rank == 0 else 0.0
        if not self._run_agreed:  # rank 0's run id, until every rank has it (agreed: alike on every rank)
            self._carried_run_id = None
            if self._comm.rank == 0 and self._logging:
                with self._rank0.step("reading the run id"):
                    self._carried_run_id = self._run_logger.sender.run_id  # never waited for: no stall
            carry.update(fit_plan.run_id_carry(self._carried_run_id, self._comm.rank, self._logging))
        if self.options.reduction == "mean":  # the exact reductions count samples in the metric states
            carry["train_samples"] = self._train_samples if self._validating else metric_state.samples(self.model)
        return carry

    def _set_fit_arguments(
        self,
        batch_size: int | None,
        empty_shards: tuple[str, ...] = (),
        folders: Sequence[Any] = (),  # delivery.folder_artifacts.FolderUpload (rank 0 uploads them)
        batches: shards.Batches | None = None,
    ) -> None:
        self._batch_size = batch_size
        self._empty_shards = empty_shards  # this rank's, from fit's arguments (as _batches)
        self._batches = batches or shards.Batches()
        self._folders = tuple(folders)  # rank 0: what of TensorBoard's folders to upload at the end
        self._ends_after_fit = True  # autolog's wrapper ends the fit once Keras' fit has returned

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
