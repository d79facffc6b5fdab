"""``hvd_mlflow.autolog()``: add the callback to every Keras ``fit`` on every rank.

``fit`` of every importable Keras flavour's ``Model`` is wrapped once. The wrapper puts a
:class:`~hvd_mlflow.HorovodMlflowCallback` of the model's own flavour FIRST in the callback list (unless the
user passed one), in whatever form ``callbacks`` was given (a list, a tuple, a Keras ``CallbackList``), and ends
the fit itself once Keras' ``fit`` has returned (after every callback's ``on_train_end``: TensorBoard's closes its
files before they are uploaded), or as FAILED when ``fit`` raises (Keras calls no ``on_train_end`` then), also for
a callback the user passed. ``fit`` never runs silently without the callback
(the ranks' values and early stopping would disagree): another tool's wrapper of ``fit`` installed before
``autolog()`` (a plain ``*args, **kwargs`` one too) is read by Keras' own signature and handed the callbacks by
keyword (:mod:`hvd_mlflow.every_rank.fit_call`); if they cannot be added, ``fit`` raises a clear error on every
rank before training. Which of this rank's shards (training, validation) are empty is read from ``fit``'s
arguments and handed to the callback, whose train-begin agreement raises the same error on every rank when any rank's
is (:mod:`hvd_mlflow.every_rank.shards`); a rank without training data makes only that agreement, not Keras' ``fit``,
which would refuse it on that rank alone.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._log import set_silent
from .callback import HorovodMlflowCallback
from .common import dependencies, topology
from .config import AutologOptions
from .delivery import destination, folder_artifacts, mlflow_calls
from .errors import HvdMlflowError
from .every_rank import batch_size, collectives, elastic, fit_call, keras_flavour, shards, tensorboard

_originals: dict[type, Callable[..., Any]] = {}
_options: AutologOptions | None = None
_run_id: str | None = None  # MLFLOW_RUN_ID when autolog() was called (start_run() deletes it)
_hooked = False  # the flavours' post-import hooks are registered (once per process)


def autolog(
    disable: bool = False,
    reduction: str | None = None,
    silent: bool | None = None,
    extra_tags: Mapping[str, str] | None = None,
    extra_params: Mapping[str, object] | None = None,
    flush_timeout: float | None = None,
    run_wait: float | None = None,
    journal_dir: str | None = None,
    guard_other_ranks: bool | None = None,
    csv_path: str | None = None,
    log_every_n_steps: int | None = None,
    rank_spread: Sequence[str] | str | None = None,
    resume: str | None = None,
    log_models: bool | None = None,
    max_metric_names: int | None = None,
    max_rows_per_metric: int | None = None,
    check_divergence: bool | None = None,
    system_metrics: bool | None = None,
    log_tensorboard: bool | None = None,
    tensorboard_profile: bool | None = None,
    tensorboard_per_rank: bool | None = None,
    allow_world_of_one: bool | None = None,
) -> None:
    """Log global per-epoch metrics of every Keras ``fit`` to MLflow, from rank 0 only.

    Call it on every rank, after ``hvd.init()`` and before ``fit``. Each epoch, every numeric entry of
    Keras' logs (``loss``, ``accuracy``, ``val_loss``, ...) is made global over all ranks with one Horovod
    collective and written back into the logs, so every later callback on every rank sees the global value;
    rank 0 logs the values to the MLflow run at ``step=epoch`` from a background thread. Inside an AzureML
    job the run is the job's (``MLFLOW_RUN_ID``); elsewhere it is rank 0's active run or a new one.

    Example::

        import horovod.tensorflow as hvd
        import hvd_mlflow

        hvd.init()
        hvd_mlflow.autolog()
        model.fit(x_shard, y_shard, epochs=20, validation_data=(xv_shard, yv_shard))

    Args:
        disable: undo a previous ``autolog()``: ``fit`` is restored.
        reduction, silent, extra_tags, extra_params, flush_timeout, run_wait, journal_dir, csv_path,
            log_every_n_steps, rank_spread, resume, log_models, max_metric_names, max_rows_per_metric,
            check_divergence, system_metrics, allow_world_of_one: the options of the callback, each described once in
            :class:`hvd_mlflow.config.Options` (and in docs/reference.md, checked against it); each defaults to
            its ``HVD_MLFLOW_<NAME>`` environment variable, then to the documented default.
        guard_other_ranks: on ranks other than 0, every MLflow write does nothing (one warning each), since every
            rank of an AzureML job shares the job's run (``HVD_MLFLOW_GUARD_OTHER_RANKS``, default on; see
            :mod:`hvd_mlflow.delivery.mlflow_calls`). MLflow's own TensorFlow/Keras autologging is off on every rank
            either way.
        log_tensorboard, tensorboard_profile, tensorboard_per_rank: Keras' ``TensorBoard`` callback in ``fit``: only
            rank 0's runs (it shows the global values) unless ``tensorboard_per_rank`` (other ranks write under
            ``<log_dir>/rank-<N>/``, left on their disks); the files of rank 0's folder that the ``fit`` wrote go
            into the run's artifacts under ``tensorboard/`` once Keras' ``fit`` has closed them (``log_tensorboard``,
            on), profiler traces only with ``tensorboard_profile`` (see :mod:`hvd_mlflow.every_rank.tensorboard`).

    Under Horovod elastic (``hvd.elastic.run``), the state of Horovod's ``UpdateEpochStateCallback`` in
    ``fit``'s callbacks is picked up: steps follow the state's epoch and a new rank 0 continues the run.
    """
    global _options, _run_id
    dependencies.require_mlflow()
    if disable:
        for model_class, original in _originals.items():
            model_class.fit = original
        _originals.clear()
        mlflow_calls.uninstall()
        _options = None
        set_silent(False)
        return
    given = dict(locals())
    given.pop("disable")
    _options = AutologOptions.resolve(**given)  # once: bad values fail here, not in fit
    set_silent(_options.silent)  # from now on: the guard's warnings before the first fit too
    _run_id = destination.run_id_from_environment()
    # when MLflow is imported (autolog() imports none): MLflow's Keras autologging off on every rank, either way
    mlflow_calls.install_when_imported(topology.current().rank, _run_id, guard_writes=_options.guard_other_ranks)
    dependencies.require_training_stack()
    global _hooked
    if not _hooked:  # each flavour's Model.fit is patched when that flavour is imported (at once if it is)
        _hooked = True
        keras_flavour.when_imported(_patch_flavour)
    else:
        for flavour in keras_flavour.FLAVOURS:
            if flavour in sys.modules:
                _patch_flavour(flavour)


def _patch_flavour(flavour: str) -> None:
    """Patch ``flavour``'s ``Model.fit`` while autolog is on (once; a broken install is left alone)."""
    if _options is None:  # turned off before this flavour was imported
        return
    try:
        model_class = keras_flavour.model_class(flavour)
    except Exception:  # noqa: BLE001 - a broken install is simply not a usable flavour
        return
    if model_class not in _originals:
        _originals[model_class] = model_class.fit
        model_class.fit = _patched_fit(model_class.fit, model_class)


def _patched_fit(original: Callable[..., Any], model_class: type) -> Callable[..., Any]:
    plan = fit_call.FitCall(original, model_class)  # read against Keras' own signature, whatever wraps it

    @functools.wraps(original)
    def fit(self, *args: Any, **kwargs: Any) -> Any:
        options = _options
        if options is None:
            return original(self, *args, **kwargs)
        collectives.check_strategy(self)  # Keras 3 under a multi-worker strategy: refused on every worker alike
        bound = plan.bind(self, args, kwargs)
        given = bound.arguments.get("callbacks")
        theirs = [cb for cb in _callbacks_in(given) if isinstance(cb, HorovodMlflowCallback)]
        if theirs:  # the user's own: ended FAILED here too when fit raises (Keras calls no on_train_end then)
            try:
                return original(self, *args, **kwargs)
            except BaseException as error:
                for callback in theirs:
                    _end_raised(callback, error)
                raise
        empty = shards.empty_parts(bound.arguments)  # this rank's own data: agreed at train begin, never raised here
        try:  # the same on every rank: it either works everywhere or fails everywhere, before any collective
            callback = HorovodMlflowCallback(
                model=self,
                run_id=destination.run_id_from_environment() or _run_id,  # start_run() may have deleted it
                elastic_state=elastic.state_from_callbacks(_callbacks_in(given)),
                options=options,
            )
            world = topology.current()  # TensorBoard calls no collective: a per-rank choice is safe (rule 2)
            users = tensorboard.for_rank(_callbacks_in(given), world.rank, options.tensorboard_per_rank)
            folders: list[Any] = []
            with callback._rank0.step("TensorBoard's folders"):  # rank 0 alone: degrades, never raises (rule 1)
                folders = _tensorboard_uploads(users, world.rank, world.size, options)
            batch = batch_size.of_fit(bound.arguments)  # given, Keras' default, or the tf.data pipeline's
            callback._set_fit_arguments(batch_size=batch, empty_shards=empty, folders=folders,
                                        batches=shards.batches(bound.arguments, batch))  # fmt: skip
            call_args, call_kwargs = bound.with_callbacks(_with_first(callback, given, self, users))
        except Exception as error:
            raise HvdMlflowError(
                f"hvd-mlflow could not add its callback to this fit ({type(error).__name__}: {error}); fit does not "
                "run without it, since the ranks' metrics and early stopping would then disagree. Pass callbacks as "
                "a list, put hvd_mlflow.HorovodMlflowCallback(model=model) first in them yourself, or call "
                "hvd_mlflow.autolog(disable=True) to train without hvd-mlflow."
            ) from error
        try:
            if shards.TRAINING in empty:  # Keras would raise on this rank alone: the agreement raises on all alike
                callback._train_begin_without_fit(self, bound.arguments.get("epochs"))
            return original(*call_args, **call_kwargs)
        except BaseException as error:
            _end_raised(callback, error)
            raise
        finally:
            callback._end_fit("FINISHED")  # after Keras' fit: every callback's on_train_end has run (TensorBoard's)

    return fit


def _end_raised(callback: HorovodMlflowCallback, error: BaseException) -> None:
    """The end of a fit that raised ``error``: FAILED, or under elastic, a reset: the fit runs again, so sending
    stops and the run stays open."""
    if elastic.is_reset(error):
        callback._after_reset()
    else:
        callback._end_fit("FAILED", error)


def _callbacks_in(given: Any) -> list[Any]:
    """The callbacks of ``fit(callbacks=...)`` in every form Keras accepts: None, a list or tuple, a
    ``CallbackList`` (Keras 3 or tf_keras)."""
    if given is None:
        return []
    if _is_callback_list(given):
        return list(given.callbacks)
    if isinstance(given, list | tuple):
        return list(given)
    return [given]  # one callback: Keras flattens it into a list of one


def _is_callback_list(value: Any) -> bool:
    return any(klass.__name__ == "CallbackList" for klass in type(value).__mro__)


def _with_first(callback: Any, given: Any, model: Any, users: list[Any]) -> Any:
    """``users`` (the user's callbacks as this rank runs them) with ``callback`` first, in the form ``given`` came in.
    A ``CallbackList`` is rebuilt as the same class (Keras computes which hooks to call when one is built), with the
    model and params it had."""
    if not _is_callback_list(given):
        return [callback, *users]
    params = dict(getattr(given, "params", None) or {})
    rebuilt = type(given)([callback, *users], model=getattr(given, "model", None) or model, **params)
    if not params:
        callback.set_params({})
    return rebuilt


def _tensorboard_uploads(users: list[Any], rank: int, size: int, options: AutologOptions) -> list[Any]:
    """Rank 0: each TensorBoard folder of this fit, with its files as they are now (only what the fit writes is
    uploaded), never the other ranks' ``rank-<N>/`` (on their disks, perhaps still written)."""
    if rank != 0 or not options.log_tensorboard:
        return []
    skip = tensorboard.other_rank_dirs(size) if options.tensorboard_per_rank else ()
    return [folder_artifacts.FolderUpload(folder, path, options.tensorboard_profile, folder_artifacts.snapshot(folder),
                                          skip) for folder, path in tensorboard.uploads(users)]  # fmt: skip
