"""After ./scripts/run-example.sh: the run the example just logged, and the command that opens the MLflow UI."""

from __future__ import annotations

import mlflow
from mlflow import MlflowClient


def main() -> None:
    uri = mlflow.get_tracking_uri()
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    [run] = client.search_runs(experiments, order_by=["attributes.start_time DESC"], max_results=1)
    print(f"\nrun {run.info.run_id} ({run.info.status}) in experiment {run.info.experiment_id} at {uri}")
    for key in sorted(run.data.metrics):
        points = client.get_metric_history(run.info.run_id, key)
        print(f"  {key:<14} {len(points)} points, last {points[-1].value:.4f}")
    if uri.startswith("sqlite:"):
        print(f"\nopen the curves:  .venv/bin/mlflow ui --backend-store-uri {uri}   (then http://127.0.0.1:5000)")


if __name__ == "__main__":
    main()
