"""Rank 0 logs the trained model at the end of ``fit`` (``log_models``): whole within its budget, or not at all.

Where the tracking server has MLflow's logged-models API (any MLflow server), the model is an MLflow model (a logged
model linked to the run under MLflow 3; ``model/`` in the run's artifacts under MLflow 2). AzureML has no such API
(``log_model`` fails there with a 404), so in an AzureML run the model goes up as plain artifacts under ``model/``: a
TensorFlow SavedModel (``model/saved_model``, what AzureML deployments load) and, with Keras 3, ``model/model.keras``.

The model upload ends with ``fit``. ``timeout`` is the model's share of ``flush_timeout``:

1. none left (0 or less): nothing is saved or started; one warning.
2. a copy is saved on the training thread (:func:`save_copy`); from then on nothing reads the
   live model, which the script may change or train on as soon as ``fit`` returns.
3. the copy goes up from a thread that ``fit`` waits for, file by file, entry file last, every request bounded, and
   undone if it cannot finish (:mod:`hvd_mlflow.delivery.model_upload`, which says why that is whole or nothing and
   what it cannot promise). A part of the budget is kept for the undo.

When the model was not logged, the warning says why and where the whole saved copy is, and how to log it by hand.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .._log import logger
from ..common import compat
from ..common.dependencies import installed_version
from ..delivery.model_upload import ARTIFACT_PATH, ModelUpload
from ..every_rank import keras_flavour

THREAD_NAME = "hvd-mlflow-model"
UNDO_SHARE, UNDO_MAX_S = 0.25, 2.0  # of the time left after the save: kept to remove what was sent, at most this
JOIN_SLACK_S = 2.0  # beyond the deadline: a request's timeouts (per socket operation), the undo's last removal
# what a saved model needs installed to load, by the backend it was trained on
REQUIREMENTS = {
    "tensorflow": ("tensorflow-cpu", "tensorflow", "tf-keras", "keras"),
    "jax": ("keras", "jax", "jaxlib"),
    "torch": ("keras", "torch"),
}


def log_model(model: Any, run_id: str, flavour: str, as_artifacts: bool, timeout: float) -> bool:
    """Log ``model`` into ``run_id`` (an MLflow model, or artifacts with ``as_artifacts``) within ``timeout``
    seconds; True when it is there whole."""
    deadline = time.monotonic() + timeout
    if timeout <= 0:
        logger.warning(
            "hvd-mlflow: the model was not logged to run %s: no time was left for it of flush_timeout (the end of fit "
            "spent it waiting for the run); nothing was saved. To log models, raise flush_timeout "
            "(HVD_MLFLOW_FLUSH_TIMEOUT)",
            run_id,
        )
        return False
    folder = Path(tempfile.mkdtemp(prefix="hvd_mlflow_model_"))
    try:
        copy = save_copy(model, folder, flavour, mlflow_model=not as_artifacts, run_id=run_id)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    left = deadline - time.monotonic()
    stop = deadline - min(UNDO_MAX_S, UNDO_SHARE * max(0.0, left))
    if time.monotonic() >= stop:
        _not_logged(run_id, f"saving it took the {timeout:.1f} s it had; nothing was sent", copy)
        return False
    upload = ModelUpload(copy, run_id, logged_model=not as_artifacts and compat.mlflow3(),
                         mlflow_model=not as_artifacts, stop=stop, end=deadline)  # fmt: skip
    thread = threading.Thread(target=upload.run, name=THREAD_NAME, daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()) + JOIN_SLACK_S)
    if thread.is_alive():  # a request of a store whose timeouts are its own (AzureML's plugin, a cloud store)
        upload.cancel()
        _not_logged(run_id, "a request of the upload is still waiting for the store's answer; no further file is "
                    "sent, and what was sent is removed when it ends, where the store allows", copy)  # fmt: skip
        return False
    outcome = upload.outcome
    if outcome.done:
        kind = "artifacts" if as_artifacts else "MLflow model"
        logger.info("hvd-mlflow: logged the model to run %s (%s)", run_id, kind)
        shutil.rmtree(folder, ignore_errors=True)  # uploaded: the local copy is not needed any more
        return True
    left_behind = (f"; these files of it could not be removed from the run: {', '.join(outcome.left_behind)[:500]} "
                   "(without the model's entry file, they do not load)") if outcome.left_behind else (
                   "; what was sent of it was removed again")  # fmt: skip
    _not_logged(run_id, f"{outcome.why}{left_behind}", copy)
    return False


def _not_logged(run_id: str, why: str, copy: Path) -> None:
    logger.warning(
        "hvd-mlflow: the model was not logged to run %s (%s). The whole saved copy is in %s; to log it by hand:  "
        "with mlflow.start_run(run_id=%r): mlflow.log_artifacts(%r, artifact_path=%r)",
        run_id,
        why,
        copy,
        run_id,
        str(copy),
        ARTIFACT_PATH,
    )


def save_copy(model: Any, folder: Path, flavour: str, mlflow_model: bool, run_id: str) -> Path:
    """Save ``model`` into ``folder/model`` (an MLflow model with ``mlflow_model``, else plain files): the trained
    model's copy on local disk, saved on the training thread before any upload.

    Saved while ``fit`` is still in its end, on the thread that trains: once ``fit`` returns the script may train on,
    change the weights or exit, and the upload (:mod:`hvd_mlflow.delivery.model_upload`) reads only this copy, never
    the live model. Two forms:

    * an MLflow model (``MLmodel`` and the flavour's files), logged as MLflow logs it: MLflow's ``tensorflow`` flavour
      for a model on TensorFlow, its ``keras`` flavour (Keras' own ``.keras`` file, any backend) for Keras 3 on JAX or
      PyTorch;
    * on AzureML, which has no logged-models API, plain files: a TensorFlow SavedModel (``saved_model/``, what AzureML
      deployments load) and, with Keras 3, the native ``model.keras`` (alone off TensorFlow: a SavedModel needs it).
    """
    target = folder / "model"
    backend = keras_flavour.backend(model)
    if mlflow_model:
        from mlflow.models import Model

        if backend == "tensorflow":
            from mlflow.tensorflow import save_model
        else:  # MLflow's keras flavour: Keras 3's own format, any backend, no TensorFlow
            from mlflow.keras import save_model
        save_model(model, str(target), mlflow_model=Model(artifact_path="model", run_id=run_id),
                   pip_requirements=requirements(backend))  # fmt: skip
        return target
    target.mkdir(parents=True, exist_ok=True)
    if flavour == "keras" and hasattr(model, "export"):  # Keras 3
        model.save(target / "model.keras")
        if backend == "tensorflow":
            model.export(str(target / "saved_model"))
    else:  # tf_keras / Keras 2: a SavedModel directory
        model.save(str(target / "saved_model"), save_format="tf")
    return target


def requirements(backend: str = "tensorflow") -> list[str]:
    """Pinned requirements of the MLflow model, without MLflow's slow inference (it loads the model again)."""
    return [f"{name}=={v}" for name in REQUIREMENTS.get(backend, ("keras",)) if (v := installed_version(name))]
