"""Rank 0 logs the trained model at the end of ``fit`` (``log_models``).

Where the tracking server has MLflow's logged-models API (any MLflow server), the model is an MLflow model
(``mlflow.tensorflow.log_model``, linked to the run). AzureML has no such API (``log_model`` fails there with a
404), so in an AzureML run the model is saved locally and uploaded as plain artifacts under ``model/``: a
TensorFlow SavedModel (``model/saved_model``, what AzureML deployments load) and, with Keras 3, the native
``model/model.keras``.

The upload runs in a thread and ``fit`` waits for it at most ``timeout`` seconds: a slow or unreachable server
never holds the end of the training longer than that. What could not be uploaded stays on disk, and the
warning says where.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from .._log import logger
from ..common import compat
from ..common.redact import redact
from ..delivery import mlflow_calls

ARTIFACT_PATH = "model"


def save_locally(model: Any, folder: Path, flavour: str) -> Path:
    """Save ``model`` into ``folder/model``: a SavedModel, plus the ``.keras`` file with Keras 3."""
    target = folder / ARTIFACT_PATH
    target.mkdir(parents=True, exist_ok=True)
    if flavour == "keras" and hasattr(model, "export"):  # Keras 3
        model.save(target / "model.keras")
        model.export(str(target / "saved_model"))
    else:  # tf_keras / Keras 2: a SavedModel directory
        model.save(str(target / "saved_model"), save_format="tf")
    return target


def log_model(model: Any, run_id: str, flavour: str, as_artifacts: bool, timeout: float) -> bool:
    """Log ``model`` into ``run_id`` (an MLflow model, or artifacts with ``as_artifacts``); True when done."""
    outcome: dict[str, Any] = {}
    folder = Path(tempfile.mkdtemp(prefix="hvd_mlflow_model_")) if as_artifacts else None

    def upload() -> None:
        try:
            with mlflow_calls.internal():
                if folder is not None:
                    from mlflow import MlflowClient

                    local = save_locally(model, folder, flavour)
                    MlflowClient().log_artifacts(run_id, str(local), artifact_path=ARTIFACT_PATH)
                else:
                    compat.log_tensorflow_model(model, ARTIFACT_PATH, run_id, _requirements())
            outcome["done"] = True
        except Exception as error:  # noqa: BLE001 - reported below; the training is over and kept
            outcome["error"] = error

    thread = threading.Thread(target=upload, name="hvd-mlflow-model", daemon=True)
    thread.start()
    thread.join(timeout)
    if outcome.get("done"):
        kind = "artifacts" if as_artifacts else "MLflow model"
        logger.info("hvd-mlflow: logged the model to run %s (%s)", run_id, kind)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)  # uploaded: the local copy is not needed any more
        return True
    why = redact(str(outcome["error"]))[:300] if "error" in outcome else f"not done within {timeout:.0f} s"
    saved = folder / ARTIFACT_PATH if folder is not None else None
    logger.warning(
        "hvd-mlflow: the model was not logged to run %s (%s)%s",
        run_id,
        why,
        f"; a saved copy is in {saved}" if saved is not None and saved.exists() else "",
    )
    return False


def _requirements() -> list[str]:
    """Pinned requirements of the logged model, without MLflow's slow inference (it loads the model again)."""
    from importlib import metadata

    out = []
    for name in ("tensorflow-cpu", "tensorflow", "tf-keras", "keras"):
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return out
