#!/usr/bin/env bash
# Rehearse an AzureML job before paying for it (Linux, root): examples/azureml/job.yml (Horovod, distribution type
# mpi: Open MPI's mpirun, as AzureML launches it) or, with --job examples/azureml/job-tfdistribute.yml, a tf.distribute
# job (type tensorflow: one process per worker with AzureML's TF_CONFIG), its command on N simulated nodes (default:
# the YAML's), against the offline AzureML front through the real azureml-mlflow plugin; then the job's run is
# printed. Options (see --help): --nodes N, --ranks-per-node M, --input epochs=3, --job PATH. The environment is the
# support matrix row of the job's kind: tf2.16 for mpi, tfdistribute (TF 2.21, no Horovod) for tensorflow, jax (Keras 3
# on JAX, no TensorFlow) for a job whose environment_variables set KERAS_BACKEND: jax (examples/azureml/job-jax.yml).
# HVD_MLFLOW_REHEARSAL_VENV=<venv> runs it in that virtual environment instead of the row's.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
job=examples/azureml/job.yml
for ((i = 1; i <= $#; i++)); do
  if [ "${!i}" = --job ]; then j=$((i + 1)); job=${!j}; fi
  case "${!i}" in --job=*) job=${!i#--job=} ;; esac
done
row=tf2.16
if [ -f "$job" ] && grep -Eq '^[[:space:]]+type:[[:space:]]*tensorflow' "$job"; then row=tfdistribute; fi
if [ -f "$job" ] && grep -Eq '^[[:space:]]+KERAS_BACKEND:[[:space:]]*["'"'"']?jax' "$job"; then row=jax; fi
venv=${HVD_MLFLOW_REHEARSAL_VENV:-$(scripts/setup-env.sh "$row" | tail -n 1)}
export TF_CPP_MIN_LOG_LEVEL=2
exec "$venv/bin/python" scripts/rehearse_azureml_job.py "$@"
