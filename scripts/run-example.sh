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
"$venv/bin/python" scripts/show_last_run.py
