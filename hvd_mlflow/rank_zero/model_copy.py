"""The trained model's copy on local disk, saved on the training thread before any upload (``log_models``).

Saved while ``fit`` is still in its end, on the thread that trains: once ``fit`` returns the script may train on,
change the weights or exit, and the upload (:mod:`hvd_mlflow.delivery.model_upload`) reads only this copy, never the
live model. Two forms:

* an MLflow model (``MLmodel`` and the flavour's files), logged as MLflow logs it: MLflow's ``tensorflow`` flavour for
  a model on TensorFlow, its ``keras`` flavour (Keras' own ``.keras`` file, any backend) for Keras 3 on JAX or PyTorch;
* on AzureML, which has no logged-models API, plain files: a TensorFlow SavedModel (``saved_model/``, what AzureML
  deployments load) and, with Keras 3, the native ``model.keras`` (alone off TensorFlow: a SavedModel needs it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..common.dependencies import installed_version
from ..every_rank import keras_flavour

# what a saved model needs installed to load, by the backend it was trained on
REQUIREMENTS = {
    "tensorflow": ("tensorflow-cpu", "tensorflow", "tf-keras", "keras"),
    "jax": ("keras", "jax", "jaxlib"),
    "torch": ("keras", "torch"),
}


def save(model: Any, folder: Path, flavour: str, mlflow_model: bool, run_id: str) -> Path:
    """Save ``model`` into ``folder/model`` (an MLflow model with ``mlflow_model``, else plain files)."""
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
