#!/usr/bin/env bash
# Set up the primary environment (from nothing if needed) and train the example CNN with 2 Horovod ranks,
# logging to MLflow's embedded default store (./mlflow.db) unless MLFLOW_TRACKING_URI says otherwise.
# Extra arguments go to examples/train_cnn.py (e.g. --epochs 20).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv=$(scripts/setup-env.sh tf2.16 | tail -n 1)
export TF_CPP_MIN_LOG_LEVEL=2
"$venv/bin/horovodrun" -np 2 -H localhost:2 --gloo "$venv/bin/python" examples/train_cnn.py "$@"
"$venv/bin/python" - <<'PY'
import mlflow
from mlflow import MlflowClient

uri = mlflow.get_tracking_uri()
client = MlflowClient(uri)
experiments = [e.experiment_id for e in client.search_experiments()]
[run] = client.search_runs(experiments, order_by=["attributes.start_time DESC"], max_results=1)
print(f"\nrun {run.info.run_id} ({run.info.status}) in experiment {run.info.experiment_id} at {uri}")
for key in sorted(run.data.metrics):
    points = client.get_metric_history(run.info.run_id, key)
    print(f"  {key:<14} {len(points)} points, last {points[-1].value:.4f}")
if uri.startswith("sqlite:"):
    print(f"\nopen the curves:  {'.venv/bin/mlflow'} ui --backend-store-uri {uri}   (then http://127.0.0.1:5000)")
PY
