"""What a tracking server accepts: MLflow's limits, and AzureML's stricter ones (../docs/azureml.md)."""

from __future__ import annotations

import dataclasses

from .destination import is_azureml


@dataclasses.dataclass(frozen=True)
class Limits:
    name_length: int = 250  # MLflow's MAX_ENTITY_KEY_LENGTH (AzureML documents 255)
    param_value_length: int = 6000  # MLflow's MAX_PARAM_VAL_LENGTH
    tag_value_length: int = 8000  # MLflow's MAX_TAG_VAL_LENGTH
    metrics_per_request: int = 1000  # MLflow's MAX_METRICS_PER_BATCH
    params_tags_per_request: int = 100  # MLflow's MAX_PARAMS_TAGS_PER_BATCH
    values_per_key_per_request: int = 250  # AzureML answers 400 above this; harmless elsewhere
    params_per_run: int | None = None  # AzureML: 200


MLFLOW = Limits()
AZUREML = dataclasses.replace(MLFLOW, tag_value_length=1000, params_per_run=200)


def for_tracking_uri(tracking_uri: str) -> Limits:
    return AZUREML if is_azureml(tracking_uri) else MLFLOW
