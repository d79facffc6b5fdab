"""What rank 0 alone does for the callback: the journal and the run, params, the per-epoch extras, the CSV file,
the model, the tags, and the end of a fit. :class:`hvd_mlflow.HorovodMlflowCallback` calls these methods on rank 0
only (where ``self._logging``: only rank 0 ever holds a run logger; ``_rank0_train_begin`` where the rank is 0), and
each of them runs inside the rank-0 guard (``self._rank0.step(...)``, :mod:`hvd_mlflow.rank_zero.guard`): the three
``_rank0_train_begin``, ``_epoch_extras`` and ``_finish_logging`` open the guard around each of their parts, the
others are called inside one. None of it may decide a collective, and what it raises becomes a warning.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._log import logger, one_line, warn_once
from ..delivery import destination, folder_artifacts, journal
from ..every_rank import keras_flavour, later_fits, metric_state, run_params
from . import exit_hook, model_logging
from .run_logger import RunLogger

HAND_OVER_WAIT_S = 5.0  # at an elastic reset, how long a request in flight may hold up the restart
INEXACT_TAG = "hvd_mlflow.inexact_keys"  # which logged values are the sample-weighted mean, not exact


class RankZeroSteps:
    """The rank-0-only half of :class:`hvd_mlflow.HorovodMlflowCallback` (a mixin: it works on the callback's
    state)."""

    _run_logger: RunLogger | None
    _csv_logger: Any
    _hosts: tuple[str, ...]
    _folders: tuple[folder_artifacts.FolderUpload, ...]
    _cancel_exit_hook: Callable[[], None] | None = None  # while a fit is open on rank 0 (not under elastic)
    model: Any
    options: Any

    def _rank0_train_begin(self, every: int) -> tuple[int, int, later_fits.Logged | None]:
        """Rank 0 at train begin: open the run and the journal; its proposal's first step, batch interval, and what
        this process logged into the run in earlier fits (not under elastic, whose steps follow its state)."""
        first_step, logged = 0, None
        with self._rank0.step("opening the run and the journal", essential=True):
            self._start_logging()
        if self._logging and self._elastic is None:  # under elastic another rank 0 may continue the run
            self._drop_exit_hook()
            ended = functools.partial(_end_orphaned, self._run_logger, self._owns_run, self.options.flush_timeout)
            self._cancel_exit_hook = exit_hook.while_open(self._end_at_exit, ended)
        with self._rank0.step("reading the optimizer's step"):
            first_step = run_params.optimizer_iterations(self.model) or 0
        if self._logging and every:
            with self._rank0.step("planning the batch curves"):
                every = self._within_row_limit(every)
        if self._logging and self._elastic is None:
            with self._rank0.step("recalling earlier fits into this run"):
                logged = later_fits.recalled(self.run_id)
        return first_step, every, logged

    def _remember_steps(self) -> None:
        """Rank 0: the steps this fit reached in its run, for a later fit of this process into the same run."""
        if self._elastic is None and self._first_epoch is not None:
            batch = self._offsets.batch(self._clock.step) if self._clock.every > 0 else None
            first = self._offsets.epoch(self._first_epoch, self._first_epoch)
            later_fits.remember(self.run_id, self._step, batch, first_epoch=first)

    def _tag_fit_start(self) -> None:
        """Rank 0, at a later fit's first epoch: the tag that says at which step each fit of this process began."""
        starts = [*self._offsets.logged.fit_starts, self._step]  # (a later fit: rank 0 recalled earlier ones)
        self._run_logger.log_tags({later_fits.FIT_STARTS_TAG: ",".join(map(str, dict.fromkeys(starts)))})

    def _epoch_extras(self, inexact: set[str]) -> None:
        """Rank 0 at an epoch end: which values are the weighted mean instead of exact (the epoch time, throughput
        and learning rate are every rank's:
        :meth:`hvd_mlflow.every_rank.epoch_exchange.EpochExchange._epoch_dynamics`)."""
        if not inexact - self._inexact_logged:
            return
        with self._rank0.step("recording which values are not exact"):  # said once, kept in a tag
            inexact = inexact | self._inexact_logged
            from_metrics = sorted(k for k in inexact if k in (self._not_additive or ()))
            if from_metrics and not set(from_metrics) <= self._inexact_logged:
                names = sorted({m.name for m in metric_state.non_additive_metrics(self.model)})
                warn_once(
                    "non-additive:" + ",".join(names),
                    "hvd-mlflow: metric(s) %s keep a state that may not add up over ranks (their update_state or "
                    "result is your code), so %s are the sample-weighted mean of the ranks' values, not the exact "
                    "value. If the state does add up (counts, sums), declare it: hvd_mlflow_additive = True on the "
                    "metric's class.",
                    ", ".join(names),
                    ", ".join(from_metrics),
                )
            self._inexact_logged = inexact
            self._run_logger.log_tags({INEXACT_TAG: ",".join(sorted(inexact))})

    def _finish_logging(self, status: str, error: BaseException | None = None) -> None:
        """Rank 0 at the end of a fit: the outcome, the model, the last epochs, all within ``flush_timeout``."""
        deadline = time.monotonic() + self.options.flush_timeout
        run_logger = self._run_logger
        self._drop_exit_hook()
        with self._rank0.step("recording the training's outcome"):  # first: a kill during the upload keeps it
            run_logger.journal.update_meta(final_status=status)  # sync ends a run hvd-mlflow created with it
        if error is not None:  # its traceback comes after the delivery, which mpirun may cut when another rank exits
            with self._rank0.step("saying what fit raised"):
                logger.error(
                    "hvd-mlflow: fit raised %s; delivering the journal (at most %.0f s) before it goes on (if this "
                    "process is stopped first:  hvd-mlflow sync %s)",
                    one_line(error, limit=500),
                    self.options.flush_timeout,
                    run_logger.journal.location,
                )
                logger.debug("hvd-mlflow: what fit raised, whole", exc_info=error)
        if status == "FINISHED":
            with self._rank0.step("logging the model"):
                if self._logs_models():  # the model gets the budget but a part kept for the last epochs
                    self._log_model(deadline - min(5.0, self.options.flush_timeout / 2), run_logger)
        with self._rank0.step("the TensorBoard logs"):  # autolog ends the fit after Keras' fit: TensorBoard is closed
            for upload in self._folders:  # only the files this fit wrote, as they are now
                run_logger.log_folder(upload.folder, upload.path, upload.profile, folder_artifacts.changed(upload))
        self._close_csv()
        self._run_logger = None
        with self._rank0.step("delivering the last epochs"):
            run_logger.sender.close(status, deadline)
            self.run_id = self.run_id or run_logger.sender.run_id  # a run opened after the last epoch's collective

    def _end_at_exit(self) -> None:
        """At process exit (:mod:`hvd_mlflow.rank_zero.exit_hook`): a fit that never reached its end (it raised
        without autolog, or the process exits in it) ends FAILED, its delivery bounded as at any end of a fit."""
        if self._finished or not self._logging:
            return
        _say_ended_at_exit(self._owns_run, self.options.flush_timeout, self._run_logger.journal.location)
        self._end_fit("FAILED")

    def _drop_exit_hook(self) -> None:
        cancel, self._cancel_exit_hook = self._cancel_exit_hook, None
        if cancel is not None:
            cancel()

    def _detach(self) -> RunLogger | None:
        """Rank 0 stops logging this fit (no exit hook, the CSV file closed): its run logger, for the caller to end."""
        run_logger, self._run_logger = self._run_logger, None
        self._drop_exit_hook()
        self._close_csv()
        return run_logger

    def _hand_over(self) -> None:
        run_logger = self._detach()
        if run_logger is None:
            return
        with self._rank0.step("handing the run over after a reset"):
            if self._elastic is not None and run_logger.sender.run_id:  # learned after run_wait: keep it
                self._elastic.agreed_run(run_logger.sender.run_id, self._owns_run)
            try:
                run_logger.journal.update_meta(ended=True)  # its run goes on: sync must not end it
            finally:
                run_logger.sender.stop(wait=HAND_OVER_WAIT_S)

    def _end_cut_fit(self) -> None:
        """The previous fit raised and nobody ended it (a callback used without autolog): end it FAILED, briefly."""
        run_logger = self._detach()
        if run_logger is not None:
            with self._rank0.step("ending the previous fit's run"):
                run_logger.sender.close("FAILED", time.monotonic() + HAND_OVER_WAIT_S)

    def _stop_logging(self) -> None:
        """Logging off for the rest of this fit (an essential rank-0 step failed): never raises."""
        try:
            run_logger = self._detach()
            if run_logger is not None:
                run_logger.sender.stop()
        except Exception as error:  # noqa: BLE001 - already degrading: say it and go on
            logger.warning("hvd-mlflow: could not stop the sender cleanly: %s", error)

    def _close_csv(self) -> None:
        csv, self._csv_logger = self._csv_logger, None
        if csv is not None:
            with self._rank0.step("the CSV file"):
                csv.on_train_end()

    def _start_logging(self) -> None:
        """Open rank 0's journal and start the sender, which creates the run if there is none (under elastic,
        within ``run_wait``, so that every rank learns its id before a reset; else once the first epoch has ended)."""
        link = self._elastic.link if self._elastic else None
        dest = destination.resolve((link.run_id if link else None) or self._captured_run_id)
        tags = run_params.run_tags(self._comm, self.options, self._flavour or "keras")
        directory = Path(self.options.journal_dir) if self.options.journal_dir else journal.default_directory()
        self._owns_run = dest.run_id is None or bool(link and link.owns_run)
        self._run_logger = RunLogger(
            dest,
            directory,
            run_tags=tags,
            resume=self.options.resume,
            owns_run=self._owns_run,
            elastic=bool(link),
            max_metric_names=self.options.max_metric_names,
            max_rows_per_metric=self.options.max_rows_per_metric,
        )
        self.run_id = dest.run_id
        if dest.run_id is not None:
            return
        with self._rank0.step("starting the sender"):  # it creates the run once the first epoch has ended
            self._run_logger.sender.start()
        if link is None:  # its id rides in the epoch collectives (fit_plan.run_id_carry): nothing waits for it
            return
        if self._run_logger.sender.alive:  # elastic: every rank must know the run before a reset can come
            self.run_id = self._run_logger.sender.wait_for_run(self.options.run_wait)
        if self.run_id is None:
            logger.info(
                "hvd-mlflow: the MLflow run at %s is not open after %.0f s; metrics are journaled and "
                "sent when it answers (other ranks do not learn the run id)",
                dest.display_uri,
                self.options.run_wait,
            )

    def _within_row_limit(self, every: int) -> int:
        """``every``, raised so that this fit's ``batch/`` curves keep within the server's rows per metric."""
        assert self._run_logger is not None
        rows = self._run_logger.limits.rows_per_metric
        params = self.params or {}
        steps, epochs = params.get("steps"), params.get("epochs")
        if not (rows and steps and epochs) or epochs * steps // every <= rows:
            return every
        raised = -(-epochs * steps // rows)
        logger.warning(
            "hvd-mlflow: log_every_n_steps=%d would log %d values of each batch/ curve, over the %d a metric may "
            "hold here (max_rows_per_metric); logging every %d steps instead",
            every,
            epochs * steps // every,
            rows,
            raised,
        )
        return raised

    def _described(self, epoch: int) -> tuple[dict[str, str], dict[str, str]]:
        """Rank 0: the run's params (``epoch``: the first epoch's) and the hosts tag (the agreed hosts)."""
        flavour = self._flavour or "keras"
        params = run_params.training_params(self.params or {}, self.model, self._comm, self._batch_size, epoch, flavour)
        return {**params, **self.options.extra_params}, run_params.hosts_tag(self._hosts)

    def _log_params(self, epoch: int | None) -> None:
        """The run's params and hosts tag: under elastic the agreed ones (``epoch`` None: only those, after a reset),
        else described now, ``epoch`` being the fit's first."""
        assert self._run_logger is not None
        kept = self._elastic.link.params if self._elastic is not None else None
        params, tags = kept if kept is not None or epoch is None else self._described(epoch)
        self._run_logger.log_params(params)
        self._run_logger.log_tags(tags)

    def _proposed_params(self) -> tuple[dict[str, str] | None, bool]:
        """Under elastic, what this process brings to the train-begin agreement: the params it kept from the first
        fit (and True), else rank 0 its own now (the first fit), else nothing."""
        if self._elastic is None:
            return None, False
        if self._elastic.link.params is not None:
            return self._elastic.link.params[0], True
        fresh = None
        if self._comm.rank == 0:
            with self._rank0.step("params"):
                fresh = self._described(int(self._elastic.state.epoch))[0]
        return fresh, False

    def _open_csv(self, append: bool) -> None:
        if self._csv_logger is None:
            self._csv_logger = keras_flavour.csv_logger(self._flavour or "keras", self.options.csv_path, append)
            self._csv_logger.set_model(self.model)
            self._csv_logger.set_params(self.params or {})
            self._csv_logger.on_train_begin()

    def _logs_models(self) -> bool:
        """``log_models`` as given, else on outside AzureML jobs (where ``log_model`` cannot work) and off inside.
        Never where saving runs the engine's collectives (tf.distribute, keras.distribution on JAX): rank 0 saving
        alone would wait for processes that never join, and fail the user's own ``model.save`` after it (seen:
        tf.distribute's UnavailableError; JAX's "not the same on each process" then a hang)."""
        if self._comm.saving_is_collective:
            if self.options.log_models:
                logger.warning(
                    "hvd-mlflow: log_models is off under %s: saving the model runs the engine's collectives on every "
                    "process (its variables span them), so rank 0 cannot save it alone. Save it on every process "
                    "(model.save, the others into folders of their own) and log rank 0's with mlflow.log_artifacts.",
                    self._comm.engine,
                )
            return False
        if self.options.log_models is not None:
            return self.options.log_models
        import mlflow

        return not destination.is_azureml_job(mlflow.get_tracking_uri())

    def _log_model(self, deadline: float, run_logger: RunLogger) -> None:
        sender = run_logger.sender
        if sender.known_down():
            logger.warning("hvd-mlflow: the model was not logged: the tracking server does not answer")
            return
        # not beyond the moment the server is known down (it cannot answer): that ends the whole end of fit soon
        run_id = self.run_id or sender.wait_for_run_at_end(min(time.monotonic() + self.options.run_wait, deadline))
        if run_id is None:
            logger.warning("hvd-mlflow: the model was not logged: the MLflow run could not be opened")
            return
        # A server gone (it cannot answer, though the sender, idle or in MLflow's retries, has not said so): MLflow's
        # client would retry the upload until the deadline. Asked before the upload starts, so that no upload is left
        # half-way, and before MLflow's import, which the sender's thread may still be doing (seconds on a busy host)
        # and which an http(s) server's question does not need.
        if sender.cannot_answer():
            _model_not_logged_server_down()
            return
        import mlflow  # after the wait: the sender's thread may still be importing it (then this waits for that)

        as_artifacts = destination.is_azureml(mlflow.get_tracking_uri())  # AzureML has no logged-models API
        if as_artifacts and sender.cannot_answer():  # the plugin's address, which the question before the import
            _model_not_logged_server_down()  # could not know while the sender's thread was still importing MLflow
            return
        model_logging.log_model(
            self.model, run_id, self._flavour or "keras", as_artifacts=as_artifacts, timeout=deadline - time.monotonic()
        )


def _model_not_logged_server_down() -> None:
    logger.warning("hvd-mlflow: the model was not logged: the tracking server does not answer (refused, closed without "
                   "an answer, or 5xx)")  # fmt: skip


def _say_ended_at_exit(owns_run: bool, flush_timeout: float, journal: str) -> None:
    logger.warning(
        "hvd-mlflow: fit did not end (it raised, or the process exits in it): %s; delivering the journal (at most "
        "%.0f s; if this process is stopped first:  hvd-mlflow sync %s)",
        "its run ends FAILED" if owns_run else "FAILED is recorded, the run (not hvd-mlflow's) is left open",
        flush_timeout,
        journal,
    )


def _end_orphaned(run_logger: RunLogger, owns_run: bool, flush_timeout: float) -> None:
    """At exit, a cut fit whose callback was collected (:mod:`.exit_hook`): its run ends FAILED, bounded alike."""
    _say_ended_at_exit(owns_run, flush_timeout, run_logger.journal.location)
    run_logger.sender.close("FAILED", time.monotonic() + flush_timeout)
