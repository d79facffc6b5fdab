#!/usr/bin/env bash
# Set up both pinned environments (from nothing if needed) and run every test:
#   ruff, then pytest three times: TF 2.16 + Keras 3, TF 2.16 + tf_keras (TF_USE_LEGACY_KERAS=1, the AzureML
#   default), TF 2.15 + Keras 2. Extra arguments go to pytest (e.g. -k multirank, -x).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
start=$(date +%s)

venv=$(scripts/setup-env.sh tf2.16 | tail -n 1) || exit 1
venv215=$(scripts/setup-env.sh tf2.15 | tail -n 1) || exit 1
# The browser check (tests/browser) drives Debian's chromium through Playwright (no browser download).
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing chromium (Debian package) for the browser test"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || exit 1
  else
    echo "== chromium is missing and this is not root: the browser test will fail (sudo apt-get install chromium)"
  fi
fi
echo "== setup done in $(( $(date +%s) - start )) s"

"$venv/bin/ruff" check . || exit 1  # every Python file of the repository, bench/ and scripts/ included
"$venv/bin/ruff" format --check . || exit 1

export TF_CPP_MIN_LOG_LEVEL=2
reports=$(mktemp -d)
status=0
run_suite() {  # label python [env...]
  local label=$1 python=$2; shift 2
  echo "== pytest: $label"
  local t0; t0=$(date +%s)
  env "$@" "$python" -m pytest -q -p no:cacheprovider --durations=12 --junitxml="$reports/$label.xml" "${pytest_args[@]}" || status=1
  echo "== $label: $(( $(date +%s) - t0 )) s"
}
# The fault-injection suite tests rank 0's delivery, the browser test reads what the MLflow UI draws, the docs test
# runs the docs' code blocks, and the tests marked "once" (AzureML's limits, the guard on rank 1, the 8-rank golden
# case, throttling) check what the Keras flavour does not change: they run once, in the primary environment.
# The multi-node suite (Open MPI over network namespaces) runs once, in the tf_keras environment (AzureML's
# default); the one-host mpirun test runs where Horovod has MPI (tf_keras) and where it has not (TF 2.15).
pytest_args=(-m "not multinode and not mpirun" "$@")
run_suite keras3 "$venv/bin/python" TF_USE_LEGACY_KERAS=0
pytest_args=(-m "multinode or mpirun or not (faults or browser or docs or once)" "$@")
run_suite tf_keras "$venv/bin/python" TF_USE_LEGACY_KERAS=1
pytest_args=(-m "mpirun or not (faults or browser or docs or once or multinode)" "$@")
run_suite tf2.15 "$venv215/bin/python" TF_USE_LEGACY_KERAS=0

echo "== benchmarks, quick mode (TF 2.15: the only environment where the seed recipe runs)"
t0=$(date +%s)
"$venv215/bin/python" -m bench.run --quick || status=1
echo "== benchmarks: $(( $(date +%s) - t0 )) s"

"$venv/bin/python" scripts/junit_summary.py "$reports"
echo "== all done in $(( $(date +%s) - start )) s"
exit $status
