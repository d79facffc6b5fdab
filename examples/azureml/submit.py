"""Submit examples/azureml/job.yml to an AzureML workspace and print the Studio link.

    pip install azure-ai-ml azure-identity
    az login
    python examples/azureml/submit.py --subscription <id> --resource-group <rg> --workspace <ws>

The environment (environment.yml) is created first if it does not exist; the compute cluster named in
job.yml (``cpu-cluster``) must exist.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from azure.ai.ml import MLClient, load_environment, load_job
from azure.identity import DefaultAzureCredential

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscription", required=True)
    parser.add_argument("--resource-group", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()

    client = MLClient(DefaultAzureCredential(), args.subscription, args.resource_group, args.workspace)
    client.environments.create_or_update(load_environment(HERE / "environment.yml"))
    job = load_job(HERE / "job.yml")
    job.inputs["epochs"] = args.epochs
    submitted = client.jobs.create_or_update(job)
    print(f"submitted {submitted.name}: {submitted.studio_url}")


if __name__ == "__main__":
    main()
