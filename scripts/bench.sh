#!/usr/bin/env bash
# Run the benchmarks in two rows of the support matrix (the oldest: TF 2.15; AzureML's: TF 2.16 with tf_keras) and write bench/results/*.json and bench/README.md's tables
# (docs/overhead.png: commit the results, then python -m bench.figures).
#   scripts/bench.sh            full numbers (about 70 minutes on 2 cores)
#   scripts/bench.sh --quick    a few minutes (what CI runs)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv=$(scripts/setup-env.sh tf2.16 | tail -n 1)
venv215=$(scripts/setup-env.sh oldest | tail -n 1)
mode=${1:-}
out=bench/results
[ "$mode" = "--quick" ] && out=$(mktemp -d)
mkdir -p "$out"
# TF 2.15 (Keras 2; the oldest row, Python 3.10, MLflow 2.12): the only environment where Horovod's
# MetricAverageCallback (the seed recipe) runs. (The numbers in bench/README.md up to issue 23 were measured in the
# former tf2.15 environment: Python 3.11, MLflow 3.15.)
"$venv215/bin/python" -m bench.run $mode --out "$out/tf2.15.json"
# TF 2.16 with tf_keras, as AzureML's curated images run it.
TF_USE_LEGACY_KERAS=1 "$venv/bin/python" -m bench.run $mode --out "$out/tf2.16-tf_keras.json"
"$venv/bin/python" bench/report.py "$out" ${mode:+--no-write}
