"""What a tracking server accepts: MLflow's limits, and AzureML's stricter ones (docs/azureml.md has the table).

The one place every limit lives. AzureML's documented per-run limits (Microsoft Learn, "Service limits in Azure
Machine Learning"): 50 metric names, 1 million rows per metric name, 250 rows of one name per uploaded batch,
50 tags with keys of at most 100 characters and values of at most 1,000, and (undocumented, enforced) 200 params.
"""

from __future__ import annotations

import dataclasses

from .destination import is_azureml


@dataclasses.dataclass(frozen=True)
class Limits:
    name_length: int = 250  # MLflow's MAX_ENTITY_KEY_LENGTH (AzureML documents 255 for metric names)
    tag_key_length: int = 250  # MLflow's MAX_ENTITY_KEY_LENGTH; AzureML: 100
    param_value_length: int = 6000  # MLflow's MAX_PARAM_VAL_LENGTH
    tag_value_length: int = 8000  # MLflow's MAX_TAG_VAL_LENGTH; AzureML: 1,000
    metrics_per_request: int = 1000  # MLflow's MAX_METRICS_PER_BATCH
    params_tags_per_request: int = 100  # MLflow's MAX_PARAMS_TAGS_PER_BATCH
    values_per_key_per_request: int = 250  # AzureML answers 400 above this; harmless elsewhere
    params_per_run: int | None = None  # AzureML: 200
    tags_per_run: int | None = None  # AzureML: 50, the run's own system tags included
    metric_names_per_run: int | None = None  # AzureML: 50 (option max_metric_names)
    rows_per_metric: int | None = None  # AzureML: 1,000,000 (option max_rows_per_metric)

    def with_options(self, max_metric_names: int | None = None, max_rows_per_metric: int | None = None) -> Limits:
        """These limits with the user's budget options applied (``0``: no limit; ``None``: the server's)."""
        changes: dict[str, int | None] = {}
        if max_metric_names is not None:
            changes["metric_names_per_run"] = max_metric_names or None
        if max_rows_per_metric is not None:
            changes["rows_per_metric"] = max_rows_per_metric or None
        return dataclasses.replace(self, **changes)


MLFLOW = Limits()
AZUREML = dataclasses.replace(
    MLFLOW,
    tag_key_length=100,
    tag_value_length=1000,
    params_per_run=200,
    tags_per_run=50,
    metric_names_per_run=50,
    rows_per_metric=1_000_000,
)


def for_tracking_uri(tracking_uri: str | None) -> Limits:
    return AZUREML if is_azureml(tracking_uri) else MLFLOW
