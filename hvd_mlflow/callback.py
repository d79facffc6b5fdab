"""The Keras callback: global epoch metrics on every rank, logged to MLflow by rank 0 alone."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import (
    collectives,
    destination,
    elastic,
    journal,
    keras_flavour,
    metric_state,
    model_logging,
    run_params,
    topology,
)
from ._log import logger, set_silent, warn_once
from .aggregate import Reducer, numeric_entries, write_back
from .config import Options
from .names import NameMap
from .redact import redact
from .run_logger import RunLogger

_concrete_classes: dict[str, type] = {}


class HorovodMlflowCallback:
    """Average Keras' epoch metrics over all Horovod ranks and log them to MLflow from rank 0.

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
    a reset the new rank 0 continues the same run (see :mod:`hvd_mlflow.elastic`).

    Args:
        model: the model that will be fitted. It picks the callback's Keras flavour (``keras`` or
            ``tf_keras``); without it the flavour is the one ``tf.keras`` resolves to.
        flavour: ``"keras"`` or ``"tf_keras"``, instead of ``model``.
        run_id: log into this run instead of ``MLFLOW_RUN_ID`` / the active run / a new one.
        elastic_state: the ``hvd.elastic`` Keras state, under elastic training.
        **options: ``reduction``, ``flush_timeout``, ``run_wait``, ``extra_tags``, ``extra_params``, ``journal_dir``,
            ``silent``, ``log_every_n_steps``, ``rank_spread``, ``resume``: see :class:`hvd_mlflow.config.Options`;
            each defaults to its ``HVD_MLFLOW_*`` environment variable.
    """

    _flavour: str | None = None  # set on the concrete per-flavour subclasses

    def __new__(cls, *args: Any, model: Any = None, flavour: str | None = None, **kwargs: Any):  # noqa: D102
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
        autolog_only = {
            "guard_other_ranks": "",
            "csv_path": " (add keras.callbacks.CSVLogger after this callback)",
        }
        for name, hint in autolog_only.items():
            if name in options:
                raise TypeError(f"{name} is an option of hvd_mlflow.autolog() only{hint}")
        self.options = Options.resolve(**options)
        set_silent(self.options.silent)
        self.run_id: str | None = None
        self._captured_run_id = run_id or destination.run_id_from_environment()
        self._elastic_state = elastic_state
        self._epoch_offset: int | None = None
        self._batches_seen = 0
        self._epoch_base_step: int | None = None
        self._batch_size: int | None = None
        self._run_logger: RunLogger | None = None
        self._reducer: Reducer | None = None
        self._train_state: metric_state.MetricState | None = None
        self._validating = False
        self._comm: collectives.Collectives = collectives.Solo()
        self._metric_names: NameMap  # built at train begin, when the rank (who warns) is known
        self._params_logged = False
        self._finished = True
        self._epoch_start = time.perf_counter()

    # -- Keras hooks -----------------------------------------------------------------------------------
    def set_model(self, model: Any) -> None:
        actual = keras_flavour.of_model(model)
        if actual != self._flavour:
            raise TypeError(
                f"this HorovodMlflowCallback was built for {self._flavour} but the model is a {actual} "
                f"model; create it with HorovodMlflowCallback(model=model)"
            )
        super().set_model(model)

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        interrupted = not self._finished  # the previous fit was cut by an elastic reset: this is a restart
        self._finished = False
        self._params_logged = False
        self._epoch_offset = None
        self._comm = collectives.current()
        self._reducer = Reducer(self._comm, self.options.reduction, spread=self.options.rank_spread)
        if self.options.reduction == "exact" and self._comm.rank == 0:
            self._warn_non_additive()
        self._metric_names = NameMap(what="metric", warn=self._comm.rank == 0)
        link = elastic.link(self._elastic_state) if self._elastic_state is not None else None
        leader = self._comm.rank == 0 and topology.current().is_chief
        if interrupted and self._run_logger is not None and not leader:
            self._finish(None, timeout=5.0)  # no longer rank 0: the new rank 0 replays what this did not send
            self._finished = False
        run_id, owns_run = (link.run_id, link.owns_run) if link else (None, False)
        if leader and self._run_logger is None:
            run_id, owns_run = self._start_logging(link)
        elif leader:
            run_id = self.run_id  # the same rank 0 as before the reset: same journal, same sender
        if self._comm.size > 1:
            run_id, owns_run = self._comm.broadcast_object((run_id, owns_run), name="hvd_mlflow.run_id")
        self.run_id = run_id
        if link is not None:
            link.run_id, link.owns_run = run_id or link.run_id, owns_run or link.owns_run
            self._params_logged = link.params_logged
            if self._run_logger is not None and not interrupted:
                for step, (timestamp_ms, values) in link.history.items():  # what the old rank 0 may not have sent
                    self._run_logger.log_metrics(step, values, timestamp_ms=timestamp_ms)

    def _implements_train_batch_hooks(self) -> bool:  # tf_keras: skip per-batch calls unless they are used
        return self.options.log_every_n_steps > 0

    # tf_keras / Keras 2: batch logs may stay tensors, so batches that are not logged cost no device sync
    _supports_tf_logs = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        every = self.options.log_every_n_steps
        if every <= 0 or logs is None or self._reducer is None:
            return
        self._batches_seen += 1
        # the global step: the optimizer's iterations, read once per epoch (reading it per batch would sync)
        step = self._batches_seen if self._epoch_base_step is None else self._epoch_base_step + batch + 1
        if step % every:
            return
        states = [metric_state.capture(self.model, prefix="")] if self.options.reduction != "mean" else []
        global_values = self._reducer.reduce(numeric_entries(logs), tag="batch", states=states)
        write_back(logs, global_values)
        names = self._metric_names(global_values)
        if self._run_logger is not None:
            logged = {f"batch/{names[k]}": v for k, v in global_values.items()}
            logged.update({f"batch/{k}": v for k, v in self._reducer.spread.items()})
            self._run_logger.log_metrics(step, logged)

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        self._train_state, self._validating = None, False
        self._epoch_start = time.perf_counter()
        if self.options.log_every_n_steps > 0:
            self._epoch_base_step = run_params.optimizer_iterations(self.model)
        if self._epoch_offset is None:
            state = self._elastic_state
            self._epoch_offset = int(state.epoch) - epoch if state is not None else 0
        if self._elastic_state is not None:  # every rank: whoever is rank 0 after a reset does not log them again
            elastic.link(self._elastic_state).params_logged = True
        if self._run_logger is not None and not self._params_logged:
            self._params_logged = True
            params = run_params.training_params(
                self.params or {},
                self.model,
                world_size=self._comm.size,
                batch_size=self._batch_size,
                initial_epoch=epoch,
                flavour=self._flavour or "keras",
            )
            self._run_logger.log_params({**params, **self.options.extra_params})

    def on_test_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        # fit's validation is about to reset the metrics: keep the training state first
        if not self._finished and not self._validating and self.options.reduction != "mean":
            self._validating = True
            self._train_state = metric_state.capture(self.model, prefix="")

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None:
            return
        assert self._reducer is not None, "on_train_begin was not called"
        states = []
        if self.options.reduction != "mean":
            if self._validating:
                states = [self._train_state, metric_state.capture(self.model, prefix="val_")]
            else:
                states = [metric_state.capture(self.model, prefix="")]
        states = [s for s in states if s is not None]
        global_values = self._reducer.reduce(numeric_entries(logs), tag="epoch", states=states)
        write_back(logs, global_values)
        names = self._metric_names(global_values)  # the same on every rank: a collision fails them all
        step = epoch + (self._epoch_offset or 0)
        if self._run_logger is None and self._elastic_state is None:
            return
        logged = {names[k]: v for k, v in global_values.items()}
        logged.update(self._reducer.spread)
        for key, value in self._dynamics().items():
            logged.setdefault(key, value)
        timestamp_ms = int(time.time() * 1000)
        if self._elastic_state is not None:  # every rank keeps it: any of them may be rank 0 after a reset
            elastic.link(self._elastic_state).remember(step, timestamp_ms, logged)
        if self._run_logger is not None:
            self._run_logger.log_metrics(step, logged, timestamp_ms=timestamp_ms)

    def _dynamics(self) -> dict[str, float]:
        """Rank 0's per-epoch extras: the learning rate now, the epoch's wall time, global samples per second."""
        seconds = time.perf_counter() - self._epoch_start
        out = {"epoch_time_s": seconds}
        rate = run_params.current_learning_rate(self.model)
        if rate is not None:
            out["learning_rate"] = rate
        samples = self._reducer.train_samples if self._reducer is not None else None
        if samples and seconds > 0:
            out["samples_per_s"] = samples / seconds
        return out

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        if self._run_logger is not None and self._logs_models():
            self._log_model()
        self._finish("FINISHED")

    def _logs_models(self) -> bool:
        """``log_models`` as given, else on outside AzureML jobs (where ``log_model`` cannot work) and off inside."""
        if self.options.log_models is not None:
            return self.options.log_models
        import mlflow

        return not destination.is_azureml_job(mlflow.get_tracking_uri())

    def _log_model(self) -> None:
        import mlflow

        assert self._run_logger is not None, "only rank 0, while logging, logs the model"
        run_id = self.run_id or self._run_logger.wait_for_run(self.options.run_wait)
        if run_id is None:
            logger.warning("hvd-mlflow: the model was not logged: the MLflow run could not be opened")
            return
        as_artifacts = destination.is_azureml(mlflow.get_tracking_uri())  # AzureML has no logged-models API
        model_logging.log_model(
            self.model, run_id, self._flavour or "keras", as_artifacts=as_artifacts, timeout=self.options.flush_timeout
        )

    # -- used by autolog -------------------------------------------------------------------------------
    def _set_fit_arguments(self, batch_size: int | None) -> None:
        self._batch_size = batch_size

    def _finish(self, status: str | None, timeout: float | None = None) -> None:
        """Flush (bounded) and end the run if hvd-mlflow created it (``status`` None: leave it open); safe to
        call twice."""
        if self._finished:
            return
        self._finished = True
        run_logger, self._run_logger = self._run_logger, None
        if run_logger is not None:
            run_logger.close(status, timeout=self.options.flush_timeout if timeout is None else timeout)

    def _warn_non_additive(self) -> None:
        names = metric_state.non_additive_names(self.model)
        if names:
            warn_once(
                "non-additive:" + ",".join(names),
                "hvd-mlflow: metric(s) %s have their own update_state/result, so their state may not add up "
                "over ranks; their global value is the sample-weighted mean instead of the exact value",
                ", ".join(names),
            )

    # -- rank 0 --------------------------------------------------------------------------------------
    def _start_logging(self, link: elastic.ElasticLink | None) -> tuple[str | None, bool]:
        """Open rank 0's journal and sender; the run id (if known within ``run_wait``) and whether we create it."""
        try:
            dest = destination.resolve((link.run_id if link else None) or self._captured_run_id)
            tags = run_params.run_tags(
                world_size=self._comm.size,
                reduction=self.options.reduction,
                flavour=self._flavour or "keras",
                extra=self.options.extra_tags,
            )
            directory = Path(self.options.journal_dir) if self.options.journal_dir else journal.default_directory()
            owns_run = dest.run_id is None or bool(link and link.owns_run)
            self._run_logger = RunLogger(
                dest,
                directory,
                run_tags=tags,
                resume=self.options.resume,
                owns_run=owns_run,
                elastic=link is not None,
            )
            if dest.run_id is not None:
                return dest.run_id, owns_run
            run_id = self._run_logger.wait_for_run(self.options.run_wait)
            if run_id is None:
                logger.info(
                    "hvd-mlflow: the MLflow run at %s is not open after %.0f s; metrics are journaled and "
                    "sent when it answers (other ranks do not learn the run id)",
                    dest.display_uri,
                    self.options.run_wait,
                )
            return run_id, owns_run
        except Exception as error:  # noqa: BLE001 - a logging problem must not stop the training
            logger.warning("hvd-mlflow: MLflow logging is off for this fit: %s", redact(str(error)))
            self._run_logger = None
            return None, False


def _concrete_class(flavour: str) -> type:
    """``HorovodMlflowCallback`` on top of ``flavour``'s ``Callback`` base class (made once per flavour)."""
    if flavour not in _concrete_classes:
        base = keras_flavour.callback_base(flavour)
        _concrete_classes[flavour] = type(
            "HorovodMlflowCallback",
            (HorovodMlflowCallback, base),
            {"_flavour": flavour, "__module__": __name__, "__doc__": HorovodMlflowCallback.__doc__},
        )
    return _concrete_classes[flavour]
