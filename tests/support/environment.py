"""The environment the test (and benchmark) processes start from: this one without MLflow's, hvd-mlflow's and
AzureML's variables, so that each launch sets exactly what it means to."""

from __future__ import annotations

import os

OWNED = ("MLFLOW_", "HVD_MLFLOW_", "AZUREML_")


def clean_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(OWNED)}
    env.update(extra)
    return env
