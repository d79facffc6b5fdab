"""The Keras callback: global epoch metrics on every rank, logged to MLflow by rank 0 alone.

Which code runs where. Every hook runs on every rank. Inside a hook, ``if self._logging:`` marks what rank 0
alone does (only rank 0 ever holds a :class:`~hvd_mlflow.rank_zero.run_logger.RunLogger`; at train begin, before it has
one, and for the optimizer step it carries, ``rank == 0``), and all of it runs inside ``self._rank0.step(...)``
(:mod:`hvd_mlflow.rank_zero.guard`), which never raises: a failure there is one warning, and logging degrades instead of
the training.

The decisions that choose which collectives a rank calls, each the same on every rank by construction:

* ``on_train_begin``: one ``allgather_object`` (:mod:`hvd_mlflow.every_rank.fit_plan`) when Horovod runs more than one
  process (Horovod's size). It agrees on rank 0's run and first global step, and checks that every rank has the
  same options that shape collectives (``reduction``, ``log_every_n_steps``, ``rank_spread``, ``system_metrics``,
  ``check_divergence``, and the compiled ``steps_per_execution``); if not, every rank raises the same error. It
  also carries which of each rank's shards are empty (:mod:`hvd_mlflow.every_rank.shards`): any is the same error
  everywhere.
* ``on_train_batch_end``: whether this batch is reduced: ``log_every_n_steps`` (agreed) and the global step, which
  is the agreed first step plus the batches counted from Keras' batch indices
  (:mod:`hvd_mlflow.every_rank.batch_steps`), never a rank's own optimizer: right when rank 0 alone restored a
  checkpoint, with ``steps_per_execution > 1`` in both Keras flavours, ``initial_epoch > 0`` and a second ``fit``.
* ``on_epoch_end``: always exactly one collective (Keras calls the hook on every rank for every epoch); an
  allgather instead of an allreduce when ``rank_spread`` is set (agreed). What goes into it differs by epoch
  (validation or not, ``validation_freq``) alike on every rank, and its layout is checked inside the same
  collective: a difference raises on every rank (:mod:`hvd_mlflow.every_rank.aggregate`).
* nothing else: rank 0's journal, sender, server answers, clock and files never decide a collective.

The class is in three parts: this module has the Keras hooks (every rank); :mod:`hvd_mlflow.every_rank.epoch_exchange`
what rides in the collectives (every rank), with what autolog hands over from ``fit``'s arguments and each rank's
train-begin proposal; :mod:`hvd_mlflow.rank_zero.steps` what rank 0 alone does (each part inside the guard).
:mod:`hvd_mlflow.every_rank.fit_plan` agrees the fit's plan and builds its batch clock.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping
from typing import Any

from ._log import set_silent
from .common import dependencies, topology
from .config import Options
from .delivery import destination
from .every_rank import collectives, elastic, fit_plan, keras_flavour, metric_state, run_params, tracing
from .every_rank.aggregate import Part, Reducer, numeric_entries
from .every_rank.batch_steps import BatchClock, logged_batches_per_collective
from .every_rank.epoch_exchange import EpochExchange
from .every_rank.later_fits import Offsets
from .every_rank.names import NameMap
from .every_rank.system_metrics import SystemSampler
from .rank_zero.guard import RankZeroGuard
from .rank_zero.run_logger import RunLogger
from .rank_zero.steps import RankZeroSteps


class HorovodMlflowCallback(EpochExchange, RankZeroSteps):
    """Make Keras' epoch metrics global over all Horovod ranks and log them to MLflow from rank 0.

    Put it FIRST in ``callbacks`` on every rank: at each epoch end it replaces every numeric entry of the
    logs by its value over all ranks (one collective for all of them; by default each Keras metric is computed
    from its state summed over ranks, i.e. on all ranks' samples together), so the callbacks after it
    (EarlyStopping, ReduceLROnPlateau, ModelCheckpoint, CSVLogger, History) see the same global values on
    every rank. Rank 0 alone records them, one point per metric per epoch at ``step=epoch``, in a journal on
    its disk, and a background thread sends them to MLflow: the training never waits on the tracking
    server, and nothing is lost when it is down. :func:`hvd_mlflow.autolog` adds this callback to every
    ``fit`` for you.

    The run is ``run_id`` if given, else the one in ``MLFLOW_RUN_ID`` when the callback is created (as in every
    AzureML job), else rank 0's active run, else a new run that rank 0 creates and ends when ``fit`` ends.

    Example::

        import horovod.tensorflow as hvd
        import hvd_mlflow

        hvd.init()
        model.fit(x, y, epochs=10, callbacks=[hvd_mlflow.HorovodMlflowCallback(model=model), ...])

    With Horovod elastic (``hvd.elastic.run``), pass the elastic state: steps follow ``state.epoch``, and after
    a reset the new rank 0 continues the same run (see :mod:`hvd_mlflow.every_rank.elastic`).

    Args:
        model: the model that will be fitted. It picks the callback's Keras flavour (``keras`` or
            ``tf_keras``); without it the flavour is the one ``tf.keras`` resolves to.
        flavour: ``"keras"`` or ``"tf_keras"``, instead of ``model``.
        run_id: log into this run instead of ``MLFLOW_RUN_ID`` / the active run / a new one.
        elastic_state: the ``hvd.elastic`` Keras state, under elastic training.
        **options: any option of :class:`hvd_mlflow.config.Options` but ``guard_other_ranks`` (an ``autolog()``
            one); each defaults to its ``HVD_MLFLOW_*`` environment variable.
    """

    _flavour: str | None = None  # set on the concrete per-flavour subclasses

    def __new__(cls, *args: Any, model: Any = None, flavour: str | None = None, **kwargs: Any):  # noqa: D102
        dependencies.require_training_stack()
        if cls._flavour is None:
            chosen = flavour or (keras_flavour.of_model(model) if model is not None else keras_flavour.of_tf_keras())
            cls = _concrete_class(chosen)
        return object.__new__(cls)

    def __init__(
        self,
        *,
        model: Any = None,
        flavour: str | None = None,
        run_id: str | None = None,
        elastic_state: Any = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.options = Options.for_callback(**options)
        set_silent(self.options.silent)
        self.run_id: str | None = None
        self._captured_run_id = run_id or destination.run_id_from_environment()
        self._elastic = elastic.ElasticSession(elastic_state) if elastic_state is not None else None
        self._set_fit_arguments(batch_size=None)  # none yet: autolog hands them over before each fit
        self._ends_after_fit = False  # autolog's: its wrapper ends the fit once Keras' fit has returned
        self._comm: collectives.Collectives = collectives.Solo()
        self._rank0 = RankZeroGuard(logging_off=self._stop_logging)
        self._run_logger: RunLogger | None = None  # rank 0 only, while logging
        self._csv_logger: Any = None  # rank 0 only, with csv_path
        self._sampler: SystemSampler | None = None  # every rank, with system_metrics
        self._finished = True
        self._begin_fit_state()

    def _begin_fit_state(self) -> None:
        self._reducer = Reducer(
            self._comm, self.options.reduction, spread=self.options.rank_spread, gather=self.options.system_metrics
        )
        self._metric_names = NameMap(what="metric", warn=self._comm.rank == 0)
        self._clock = BatchClock(0, self.options.log_every_n_steps)
        # every rank's logged batches whose global values are not known yet, until ``_per_collective`` of them are
        # there (then one collective reduces them all) or the epoch ends (they ride in its collective)
        self._pending: list[tuple[int, int, Part]] = []  # (step, timestamp_ms, part), oldest first
        self._per_collective = 1
        self._train_state: metric_state.MetricState | None = None
        self._train_samples = 0.0  # reduction="mean": this rank's training samples, kept before validation
        self._not_additive: set[str] | None = None  # result keys of metrics whose state does not add up
        self._inexact_logged: set[str] = set()
        self._diverged_at: int | None = None  # the first epoch the ranks' weights differed (every rank knows it)
        self._validating = False
        self._params_logged = bool(self._elastic and self._elastic.link.params_logged)
        self._owns_run = False
        self._hosts: tuple[str, ...] = ()  # every rank's host (agreed at train begin), tagged with the params
        self._step = 0
        self._offsets = Offsets()  # a later fit into a run this process logged into moves on (agreed)
        self._first_epoch: int | None = None  # Keras' first epoch of this fit (initial_epoch)
        self._epoch_start = time.perf_counter()
        self._run_agreed = True  # every rank knows the run (or never will): nothing rides for it
        self._carried_run_id: str | None = None  # rank 0: the run id it carried in the last epoch collective
        self._traced: list[tracing.Traced] | None = None  # this rank's, once their background traces started

    @property
    def _logging(self) -> bool:
        """Rank 0, logging: what only rank 0 does runs under this, inside ``self._rank0.step``."""
        return self._run_logger is not None

    # -- Keras hooks -----------------------------------------------------------------------------------
    def set_model(self, model: Any) -> None:
        keras_flavour.check_model(model, self._flavour)
        super().set_model(model)

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        if self._elastic is not None:
            self._elastic.fit_begins()
        if self._run_logger is not None:  # the previous fit was cut: a reset (whoever is rank 0 now replays it),
            self._hand_over() if self._elastic is not None else self._end_cut_fit()  # or it raised, without autolog
        # the engine: Horovod, the model's multi-worker tf.distribute strategy, or one process (alike everywhere);
        # a launcher's world that the training does not see raises on every process alike
        self._comm = collectives.for_fit(self.model, self.options.allow_world_of_one)
        self._finished = False
        self._stop_sampler()  # a sampler of a fit that raised (without autolog) must not run on
        self._begin_fit_state()
        first_step, every, logged = 0, self.options.log_every_n_steps, None
        if self._comm.rank == 0:
            first_step, every, logged = self._rank0_train_begin(every)  # each of its parts inside the rank-0 guard
        plan = fit_plan.agree(self._comm, self._proposal(first_step, every, logged))
        self.run_id = plan.run_id
        self._run_agreed = plan.run_id is not None  # else rank 0 carries it in the epoch collectives
        self._hosts = plan.hosts
        self._offsets = Offsets.after(plan.logged, plan.first_step)
        if self._elastic is not None:
            self._elastic.agreed_run(plan.run_id, plan.owns_run)
            self._elastic.agreed_params(plan.params, run_params.hosts_tag(plan.hosts))
        self._clock = fit_plan.batch_clock(plan, self.model, warn=self._comm.rank == 0)
        self._per_collective = logged_batches_per_collective(self._clock.every)  # from the agreed interval
        if self.options.system_metrics:  # every rank samples its own process
            self._sampler = SystemSampler(topology.current().local_rank)
            self._sampler.start()
        if self._logging:
            with self._rank0.step("starting the sender"):  # without it the journal still keeps everything, for sync
                self._run_logger.sender.start()
            if self._elastic is not None and self._elastic.link.params and self._params_logged:  # the same values
                with self._rank0.step("the params again, after the reset"):  # the old rank 0 may not have sent them
                    self._log_params(epoch=None)
            if self._elastic is not None and self.options.resume == "skip":  # what the old rank 0 may not have sent
                with self._rank0.step("replaying the epochs before the reset", essential=True):
                    self._run_logger.log_metrics_many(self._elastic.replay())  # one transaction

    def _implements_train_batch_hooks(self) -> bool:  # tf_keras: skip per-batch calls unless they are used
        return self.options.log_every_n_steps > 0

    # tf_keras / Keras 2: batch logs may stay tensors, so batches that are not logged cost no device sync
    _supports_tf_logs = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = self._clock.after_batch(batch)
        if step is None:
            return
        part = Part(numeric_entries(logs or {}), tuple(self._epoch_states()),
                    not_additive=frozenset(self._not_additive_keys()))  # fmt: skip
        self._pending.append((self._offsets.batch(step), int(time.time() * 1000), part))
        if len(self._pending) < self._per_collective:
            return  # kept (this rank's own values stay in logs): reduced with the next collective
        kept, self._pending = self._pending, []
        results = self._reducer.reduce_all([part for _, _, part in kept], tag="batch")  # one collective
        if logs is not None:  # global at the batch the collective ran
            logs.update(results[-1].values)
        points = self._batch_points(kept, results)
        if self._logging:
            with self._rank0.step("journaling batch values", essential=True):  # synced by the epoch's commit
                self._run_logger.log_metrics_many(points, durable=False)

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        self._train_state, self._validating = None, False
        self._epoch_start = time.perf_counter()
        self._clock.epoch_begins()
        self._first_epoch = epoch if self._first_epoch is None else self._first_epoch
        self._step = self._elastic.step(epoch) if self._elastic else self._offsets.epoch(epoch, self._first_epoch)
        if self._logging and self._offsets.later_fit and epoch == self._first_epoch:
            with self._rank0.step("tagging where this fit starts"):
                self._tag_fit_start()
        if self._logging and not self._params_logged:
            with self._rank0.step("params"):  # under elastic the agreed ones (any later rank 0 logs them again)
                self._log_params(epoch)
        self._params_logged = True
        if self._elastic is not None:  # every rank: whoever is rank 0 after a reset does not log them again
            self._elastic.link.params_logged = True
        if self._logging and self.options.csv_path:
            with self._rank0.step("the CSV file"):
                self._open_csv(append=epoch > 0)

    def on_test_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        if not self._finished and not self._validating:  # fit's validation is about to reset the metrics
            self._keep_train_state()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None:
            return
        kept, self._pending = self._pending, []  # the logged batches not reduced yet ride in the epoch's collective
        states, carry = tuple(self._epoch_states()), self._epoch_carry()
        part = Part(numeric_entries(logs), states, carry, frozenset(self._not_additive_keys()))
        *before, reduced = self._reducer.reduce_all([*(p for _, _, p in kept), part], tag="epoch")  # one collective
        logs.update(reduced.values)  # later callbacks see the global values
        self._learn_run_id(reduced)
        batch_points = self._batch_points(kept, before)
        rank0_step = reduced.carried.get("rank0_step", math.nan)
        if math.isfinite(rank0_step):  # agreed by every rank: the batch count never drifts from the optimizer
            self._clock.anchor(int(rank0_step))
        logged = self._named(reduced)  # on every rank: a name collision raises on every rank
        logged.update(self._ranks_health(reduced))
        for key, value in self._epoch_dynamics(reduced).items():  # every rank: the time, throughput, learning rate
            logged.setdefault(key, value)
        if self._logging:
            self._epoch_extras(reduced.inexact)  # each of its parts inside the rank-0 guard
        timestamp_ms = int(time.time() * 1000)
        if self._elastic is not None:  # every rank keeps it: any of them may be rank 0 after a reset
            self._elastic.link.remember(self._step, timestamp_ms, logged)
        if self._logging:
            with self._rank0.step("journaling the epoch", essential=True):  # one synced transaction
                self._run_logger.log_metrics_many([*batch_points, (self._step, timestamp_ms, logged)])
                self._remember_steps()
                self._run_logger.sender.begin()  # Keras' tracing is over: MLflow's import and the run may start
            if self._csv_logger is not None:
                with self._rank0.step("the CSV file"):
                    self._csv_logger.on_epoch_end(epoch, logs)
        self._trace_ahead(epoch)

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        if not self._ends_after_fit:  # under autolog, after every callback's on_train_end (TensorBoard's closes files)
            self._end_fit("FINISHED")

    # -- the end of a fit (called by autolog after Keras' fit) ------------------------------------------
    def _end_fit(self, status: str, error: BaseException | None = None) -> None:
        """Log the model, deliver and close, all within ``flush_timeout`` in total; safe to call twice. ``error``:
        what ``fit`` raised (said on rank 0 before the last delivery, which a launcher may cut short)."""
        if self._finished:
            return
        self._finished = True
        self._stop_sampler()
        if self._logging:
            self._finish_logging(status, error)  # each of its parts inside the rank-0 guard
            with self._rank0.step("remembering this fit's steps"):  # the run's id may be known only now
                self._remember_steps()

    def _after_reset(self) -> None:
        """``fit`` was cut by an elastic reset and will run again: stop sending at once, leave the run open."""
        self._finished = True
        self._stop_sampler()
        self._hand_over()


@functools.cache
def _concrete_class(flavour: str) -> type:
    """``HorovodMlflowCallback`` on top of ``flavour``'s ``Callback`` base class (made once per flavour)."""
    return type(
        "HorovodMlflowCallback",
        (HorovodMlflowCallback, keras_flavour.callback_base(flavour)),
        {"_flavour": flavour, "__module__": __name__, "__doc__": HorovodMlflowCallback.__doc__},
    )
