"""The environment the test (and benchmark) processes start from: this one without MLflow's, hvd-mlflow's and
AzureML's variables, so that each launch sets exactly what it means to."""

from __future__ import annotations

import os

OWNED = ("MLFLOW_", "HVD_MLFLOW_", "AZUREML_")
SUITE_MARK = "HVD_MLFLOW_SUITE"  # scripts/test.sh's mark on every process the suite starts: kept, so that it can check
# at its end that none of them (a rank, a worker, a server) outlived it; no hvd-mlflow option has this name


def clean_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(OWNED) or k == SUITE_MARK}
    env.update(extra)
    return env
