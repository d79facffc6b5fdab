#!/usr/bin/env bash
# Rehearse examples/azureml/job.yml before paying for it (Linux, root): its command on N simulated nodes (default:
# the YAML's 2 x 1 rank), launched by Open MPI's mpirun as AzureML launches it, against the offline AzureML front
# through the real azureml-mlflow plugin; then the job's run is printed. Options (see --help): --nodes N,
# --ranks-per-node M, --input epochs=3, --job PATH.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv=$(scripts/setup-env.sh tf2.16 | tail -n 1)
export TF_CPP_MIN_LOG_LEVEL=2
exec "$venv/bin/python" scripts/rehearse_azureml_job.py "$@"
