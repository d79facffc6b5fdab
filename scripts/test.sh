#!/usr/bin/env bash
# Set up the support matrix's five rows (from nothing if needed; docs/support-matrix.md) and run every test:
#   ruff, then pytest once per row: "plain MLflow, newest" (TF 2.18 + Keras 3.15, MLflow 3.17, no AzureML plugin),
#   "AzureML today" (TF 2.16 + tf_keras with TF_USE_LEGACY_KERAS=1, MLflow 3.15 + azureml-mlflow), "oldest
#   supported" (TF 2.15 + Keras 2, MLflow 2.12 + azureml-mlflow 1.56, Python 3.10), "tf.distribute, newest TensorFlow"
#   (TF 2.21 + tf_keras, no Horovod, MLflow 3.15 + azureml-mlflow: the tf.distribute engine's tests only), "Keras 3 on
#   JAX" (no TensorFlow: the JAX engine's tests only). Extra arguments go to pytest.
#
#   scripts/test.sh --quick [pytest args]   # a contributor's inner loop: ruff, then the unit and single-process tests
#                                            # of the primary row (AzureML's, .venv) only, in a few minutes
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [ "${1:-}" = "--quick" ]; then
  shift
  t0=$(date +%s)
  venv=$(scripts/setup-env.sh tf2.16 | tail -n 1) || exit 1
  "$venv/bin/ruff" check . && "$venv/bin/ruff" format --check . || exit 1
  # the packaging test builds a venv and installs into it (minutes): the full suite runs it
  quick() { TF_CPP_MIN_LOG_LEVEL=2 TF_USE_LEGACY_KERAS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    --durations=5 tests/unit tests/single_process --ignore=tests/single_process/test_packaging.py "$@"; }
  quick -n 2 --dist worksteal -m "not alone" "$@"; status=$?  # two at a time, then those marked "alone"
  quick -m alone "$@"; code=$?; [ "$code" = 0 ] || [ "$code" = 5 ] || status=$code
  echo "== quick (AzureML row: unit and single-process tests): $(( $(date +%s) - t0 )) s"
  exit $status
fi
start=$(date +%s)
export HVD_MLFLOW_SUITE="$$-$start"  # marks every process the suite starts (checked at the end)

# The rows are set up side by side: a row's downloads and pip installs wait on the network and the disk, its
# Horovod compile (three rows) on the CPU, and one compile alone leaves a core idle in its single-threaded steps.
# Apt runs one at a time (setup-env.sh and the chromium install below share a lock). Each row keeps its own output,
# shown once it is done.
side=$(mktemp -d)
rows=(tf2.16 newest oldest tfdistribute jax)
declare -A setup_pid
for matrix in "${rows[@]}"; do
  scripts/setup-env.sh "$matrix" >"$side/$matrix.path" 2>"$side/$matrix.log" &
  setup_pid[$matrix]=$!
done
# a row that fails ends the suite: the others' set-ups end with it, their pip and compilers too (not left writing)
source "$root/scripts/lib/kill_tree.sh"
trap 'for pid in "${setup_pid[@]}"; do kill_tree "$pid"; done' EXIT
(
  # The browser check (tests/browser) drives Debian's chromium through Playwright (no browser download).
  if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "== installing chromium (Debian package) for the browser test"
      flock "${TMPDIR:-/tmp}/hvd-mlflow-apt.lock" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -o DPkg::Lock::Timeout=600 -y -qq chromium >/dev/null' || exit 1
    else
      echo "== chromium is missing and this is not root: the browser test will fail (sudo apt-get install chromium)"
    fi
  fi
) >"$side/chromium.log" 2>&1 &
chromium_setup=$!
for matrix in "${rows[@]}"; do
  wait "${setup_pid[$matrix]}" || { echo "== setting up $matrix failed:"; cat "$side/$matrix.log"; exit 1; }
  echo "== $matrix: $(paste -sd' ' "$side/$matrix.path")"  # its versions (when it was set up now) and its venv
done
venv=$(tail -n 1 "$side/tf2.16.path")
venv_newest=$(tail -n 1 "$side/newest.path")
venv_oldest=$(tail -n 1 "$side/oldest.path")
venv_tfd=$(tail -n 1 "$side/tfdistribute.path")
venv_jax=$(tail -n 1 "$side/jax.path")
wait "$chromium_setup" || { cat "$side/chromium.log"; exit 1; }
trap - EXIT
cat "$side/chromium.log"
echo "== setup done in $(( $(date +%s) - start )) s"
durations="  set-up (${#rows[@]} rows): $(( $(date +%s) - start )) s"

"$venv/bin/ruff" check . || exit 1  # every Python file of the repository, bench/ and scripts/ included
"$venv/bin/ruff" format --check . || exit 1

export TF_CPP_MIN_LOG_LEVEL=2
reports=$(mktemp -d)
status=0
user_args=("$@")
run_phase() {  # report markers [pytest args...] (the row's python and environment: row_python, row_env)
  local report=$1 markers=$2; shift 2
  env "${row_env[@]}" "$row_python" -m pytest -q -p no:cacheprovider --durations=12 --junitxml="$reports/$report.xml" \
    -m "$markers" "$@" "${user_args[@]}"
  local code=$?
  [ "$code" = 0 ] || [ "$code" = 5 ] || status=1  # 5: no test of this phase in this row
}
phases="shared alone"
run_suite() {  # label python markers [VAR=value...] (phases=alone: the row has no test for the shared phase)
  # Two phases: the tests that may share the machine two at a time (pytest-xdist: most of them wait on a process,
  # a server or a browser as much as they compute), then those marked "alone", one at a time (tests/conftest.py:
  # Horovod ranks but for the multi-rank tests marked "shared", tf.distribute workers, mpirun, the fault injection,
  # and what bounds a duration).
  local label=$1 row=$3 t0; row_python=$2; shift 3; row_env=("$@")
  echo "== pytest: $label"
  t0=$(date +%s)
  [ "$phases" = alone ] || run_phase "$label-shared" "($row) and not alone" -n 2 --dist worksteal
  run_phase "$label-alone" "($row) and alone"
  echo "== $label: $(( $(date +%s) - t0 )) s"
  durations+=$'\n'"  $label row: $(( $(date +%s) - t0 )) s"
}
# Each test runs in one row only, but the flavour-dependent ones (in every row). The fault-injection suite, the
# browser test, the docs test and the tests marked "once" (the guard on rank 1, the 8-rank golden case, throttling,
# the command line, the sender) check what neither the Keras flavour nor the MLflow version changes: they run once, in
# the newest row; those among them that need the azureml-mlflow plugin (marked "azureml": AzureML's limits, the plugin
# path) run where it is installed, in the AzureML row. The test of a sync into MLflow's default store (marked
# "default_store": no tracking URI, which an AzureML job always has) runs in the newest row (MLflow 3's sqlite
# default) and the oldest (MLflow 2's mlruns, Keras 2's API): the AzureML row adds neither. The multi-node suite (Open
# MPI over network namespaces) runs in the AzureML row; the one-host mpirun test where Horovod has MPI (AzureML) and
# where it has not (oldest). The oldest row shares the AzureML row's Keras 2 flavour: of the multi-rank tests it runs
# those marked "oldest" (exact values, Horovod's own callbacks, which only work on TF 2.15, model logging with MLflow
# 2.12, elastic with TF 2.15's own tf.keras) and the plugin path with its old azureml-mlflow; its unit and
# single-process tests all (MLflow 2.12's client and server). The three Horovod rows fork each rank of a test's job
# (and a one-process job) from an interpreter that imported TensorFlow once (tests/support/rank_zygote.py): without
# it, every rank of each of a row's jobs imports TensorFlow anew.
zygotes=HVD_MLFLOW_TEST_RANK_ZYGOTE=1
run_suite newest "$venv_newest/bin/python" "not multinode and not mpirun and not azureml and not tfdistribute and not jax" \
  TF_USE_LEGACY_KERAS=0 "$zygotes"
run_suite azureml "$venv/bin/python" \
  "not tfdistribute and not jax and not default_store and (multinode or mpirun or azureml or not (faults or browser or docs \
or once))" TF_USE_LEGACY_KERAS=1 "$zygotes"
run_suite oldest "$venv_oldest/bin/python" "not tfdistribute and not jax and (mpirun or not (faults or browser or docs or once or \
multinode)) and (oldest or azureml or mpirun or not multirank)" TF_USE_LEGACY_KERAS=0 "$zygotes"
# The tf.distribute engine's tests (marked "tfdistribute"): TF 2.21 + tf_keras, no Horovod (docs/support-matrix.md).
# tests/conftest.py makes every test marked "tfdistribute" run alone (workers): no shared phase, whose collection
# alone costs ~17 s.
phases=alone run_suite tfdistribute "$venv_tfd/bin/python" "tfdistribute" TF_USE_LEGACY_KERAS=1
# Keras 3 on JAX without TensorFlow (marked "jax"): one process, and keras.distribution across processes
# (docs/support-matrix.md). No TensorFlow in this row: its tests import none. One phase, one at a time (every test in
# tests/jax is marked "alone"): for its dozen tests a shared phase's second interpreter, server and collection cost
# more than they save (CI at 776935f: 66 s shared + 146 s alone, against 161 s in one sequential run).
phases=alone run_suite jax "$venv_jax/bin/python" "jax" KERAS_BACKEND=jax

echo "== benchmarks, quick mode (the oldest row, TF 2.15: the only environment where the seed recipe runs)"
t0=$(date +%s)
"$venv_oldest/bin/python" -m bench.run --quick || status=1
echo "== benchmarks: $(( $(date +%s) - t0 )) s"
durations+=$'\n'"  quick benchmarks: $(( $(date +%s) - t0 )) s"

"$venv/bin/python" scripts/junit_summary.py "$reports"
# Nothing this suite started may outlive it (a server's workers, a rank, a tf.distribute worker): every process it
# started carries HVD_MLFLOW_SUITE in its environment.
sleep 2
marked=$(grep -lsz "^HVD_MLFLOW_SUITE=$HVD_MLFLOW_SUITE\$" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3)
left=""
for pid in $marked; do  # the scan's own processes have ended by now; this script is not one of them
  [ "$pid" != "$$" ] && [ -d "/proc/$pid" ] && left="$left $pid"
done
if [ -n "${left// /}" ]; then
  echo "== processes started by the suite are still running (ended now):"
  for pid in $left; do ps -o pid=,args= -p "$pid" | cut -c1-200; done
  for pid in $left; do kill -9 "$pid" 2>/dev/null; done
  status=1
fi
echo "== durations"
echo "$durations"
echo "== all done in $(( $(date +%s) - start )) s"
exit $status
