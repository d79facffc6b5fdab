#!/usr/bin/env bash
# Create (or bring up to date) a virtual environment for one row of the support matrix.
#
#   scripts/setup-env.sh [tf2.16|newest|oldest|tfdistribute|jax]   # default tf2.16; prints the venv's path last
#
# The rows (docs/support-matrix.md): tf2.16 = AzureML today (.venv), newest = plain MLflow, newest (.venv-newest),
# oldest = the oldest versions declared (.venv-oldest), tfdistribute = tf.distribute on the newest TensorFlow, no
# Horovod (.venv-tfdistribute), jax = Keras 3 on JAX, no TensorFlow (.venv-jax).
# Everything is pinned by requirements/<matrix>.txt, used as a constraints file in every pip call. A line
#   # setup-env: python=python3.10 controllers=gloo extras=test,azureml
# in that file picks the Python, Horovod's controllers and hvd-mlflow's extras (defaults: python3.11; mpi-gloo for
# tf2.16, else gloo; test,azureml). A row without a horovod pin has no Horovod (controllers=none).
# Horovod 0.28.1 is source-only: it is compiled against the venv's TensorFlow, and the wheel is cached
# outside the clone, keyed by Python and TensorFlow versions ($HVD_MLFLOW_CACHE, default
# ~/.cache/hvd-mlflow), and controllers. With an empty cache it is built from source (2-5 minutes on 2 cores),
# through a compiler cache kept beside the wheels ($HVD_MLFLOW_CACHE/ccache) that the rows' compiles share.
# The primary environment (tf2.16, AzureML's) builds it with MPI and Gloo, as AzureML's images do
# (examples/azureml/environment/Dockerfile): Open MPI's mpirun is how AzureML starts every rank. Open MPI comes
# from Debian (openmpi-bin, libopenmpi-dev) when root. The other environments stay Gloo-only.
set -euo pipefail

matrix=${1:-tf2.16}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
constraints="$root/requirements/$matrix.txt"
[ -f "$constraints" ] || { echo "unknown matrix '$matrix' (no $constraints)" >&2; exit 2; }
case "$matrix" in tf2.16) venv="$root/.venv" ;; *) venv="$root/.venv-$matrix" ;; esac
setting() { sed -nE "s/^# setup-env:.* $1=([^ ]+).*/\1/p" "$constraints" | head -n 1; }
python=${PYTHON:-$(setting python)}; python=${python:-python3.11}
controllers=$(setting controllers)
case "$matrix" in tf2.16) controllers=${controllers:-mpi-gloo} ;; *) controllers=${controllers:-gloo} ;; esac
extras=$(setting extras); extras=${extras:-test,azureml}
log() { echo "[setup-env $matrix +${SECONDS}s] $*" >&2; }  # seconds since this row's set-up began
# pyenv's shim refuses a version that is not pyenv's global one: then take the interpreter from pyenv's versions.
if ! "$python" -c '' 2>/dev/null; then
  for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"${python#python}".*/bin/"$python"; do
    [ -x "$candidate" ] && { python=$candidate; break; }
  done
fi

pin() { sed -nE "s/^$1==([^ ]+).*/\1/p" "$constraints"; }

# Re-run only when the pins, this script or the package metadata changed.
stamp="$venv/.hvd-mlflow-setup"
want=$(cat "$constraints" "${BASH_SOURCE[0]}" "$root/setup.cfg" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  log "up to date: $venv"
  echo "$venv"; exit 0
fi

[ -x "$venv/bin/python" ] || { log "creating $venv with $python"; "$python" -m venv "$venv"; }
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }
pip install -c "$constraints" pip setuptools wheel

tf=$(pin tensorflow-cpu)
if [ -n "$tf" ]; then
  log "installing tensorflow-cpu==$tf"
  pip install -c "$constraints" "tensorflow-cpu==$tf"
else
  log "no tensorflow in this row"
fi
if grep -q '^tf-keras==' "$constraints"; then
  pip install -c "$constraints" --no-deps "tf-keras==$(pin tf-keras)"
fi

# Horovod, compiled against this TensorFlow (cached by Python + TensorFlow version).
hvd=$(pin horovod)
pyver=$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ -n "$hvd" ] || controllers=none
case "$controllers" in mpi-gloo) mpi_flag=HOROVOD_WITH_MPI=1 ;; gloo) mpi_flag=HOROVOD_WITHOUT_MPI=1 ;; none) ;;
  *) echo "unknown controllers '$controllers' in $constraints (mpi-gloo, gloo or none)" >&2; exit 2 ;; esac
cache_root="${HVD_MLFLOW_CACHE:-$HOME/.cache/hvd-mlflow}"
cache="$cache_root/horovod-$hvd/py$pyver-tf$tf-$controllers"
apt_install() {  # what [package...]: Debian packages when root, else say what is missing
  local what=$1; shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing $* (Debian packages) for $what"
    # one apt at a time: scripts/test.sh sets the rows up side by side (apt-get update takes its lock without waiting)
    flock "${TMPDIR:-/tmp}/hvd-mlflow-apt.lock" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -o DPkg::Lock::Timeout=600 -y -qq "$@" >/dev/null' apt "$@"
  else
    log "$what needs the Debian packages $*: install them (sudo apt-get install $*)"; exit 1
  fi
}
if [ "$controllers" = mpi-gloo ] && ! command -v mpicxx >/dev/null; then
  apt_install "horovod with MPI" openmpi-bin libopenmpi-dev
fi
# Horovod's compile (CPU) runs beside the install of hvd-mlflow's requirements (network and disk): it needs only
# TensorFlow, and the constraints keep every package it imports at the version already installed.
source "$root/scripts/lib/kill_tree.sh"
build_horovod() {
  log "building horovod $hvd ($controllers) against tensorflow $tf (no cached wheel in $cache); this takes minutes"
  local tools=(cmake g++) tool missing=()
  [ "$(id -u)" = 0 ] && tools+=(ccache)  # not root: compiled without the compiler cache
  for tool in "${tools[@]}"; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [ ${#missing[@]} = 0 ] || apt_install "compiling horovod (the system's cmake 3.x, not the PyPI 4.x wheel)" "${missing[@]}"
  local tmp; tmp=$(mktemp -d)
  # Horovod's setup.py configures CMake's RelWithDebInfo (optimised, with -g): -O1 code without the debug
  # information compiles faster and makes a smaller wheel (through Horovod's HOROVOD_CMAKE, a cmake that adds
  # settings). The oldest row's wheel: 100 s at -O1, 130 s at -O2 without -g, 167 s as Horovod configures it.
  local settings="'-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG' '-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG'"
  # Most of Horovod's objects (Gloo, twice, and its common code) depend on neither TensorFlow nor Python: through
  # ccache, the rows' compiles share them. scripts/test.sh sets the rows up side by side: the first compile runs
  # alone and fills the compiler cache, the others then run side by side (each compiles its few TensorFlow objects).
  # Measured: after one row's compile, another's took 79 s instead of ~105 s (17 of 108 objects compiled).
  local ccache_dir="$cache_root/ccache"
  command -v ccache >/dev/null && settings+=" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"
  # Building, only what TensorFlow's extension links: with TensorFlow's C++17 ABI, its own copy of Gloo, not the
  # plain one (for PyTorch and MXNet, which are left out): 37 of 101 objects, 25 of 140 s of compiling.
  printf '#!/bin/sh\nif [ "$1" = --build ]; then dir=$2; shift 2; exec cmake --build "$dir" --target tensorflow "$@"; fi
exec cmake "$@" %s\n' "$settings" >"$tmp/cmake_without_debug_info"
  chmod +x "$tmp/cmake_without_debug_info"
  mkdir -p "$ccache_dir"
  (
    export CMAKE_POLICY_VERSION_MINIMUM=3.5 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 "$mpi_flag" \
      HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 HOROVOD_CMAKE="$tmp/cmake_without_debug_info" \
      CCACHE_DIR="$ccache_dir" CCACHE_BASEDIR="${TMPDIR:-/tmp}"  # pip builds in a new temporary folder
    if command -v ccache >/dev/null; then
      flock 9  # the first compile holds the lock until it is done; a failed one leaves the filling to the next
      [ -e "$ccache_dir/.filled" ] && flock -u 9
    fi
    pip wheel -c "$constraints" --no-build-isolation --no-deps --no-cache-dir "horovod==$hvd" -w "$tmp" 9>&- &&
      touch "$ccache_dir/.filled"
  ) 9>"$ccache_dir/.lock" || return 1
  mkdir -p "$cache"
  mv "$tmp"/horovod-*.whl "$cache"/
  log "built horovod $hvd"
  rm -rf "$tmp"
}
build=""
if [ "$controllers" = none ]; then
  log "no horovod in this row"
elif ! ls "$cache"/horovod-"$hvd"-*.whl >/dev/null 2>&1; then
  build_horovod &
  build=$!
  trap 'kill_tree $build' EXIT  # a failed install ends the compile too
fi

log "installing hvd-mlflow's requirements with the extras $extras"
mapfile -t requirements < <("$venv/bin/python" - "$root/setup.cfg" "$extras" <<'EOF'
import configparser, sys
cfg = configparser.ConfigParser()
cfg.read(sys.argv[1])
wanted = [cfg["options"]["install_requires"]] + [cfg["options.extras_require"][e] for e in sys.argv[2].split(",") if e]
print("\n".join(line.strip() for block in wanted for line in block.splitlines() if line.strip()))
EOF
)
# at a lower priority: a Horovod compile (this row's or another's) is the longest step of the set-up, the
# requirements' installs (unpacking, byte-compiling) take the CPU it leaves
nice -n 10 "$venv/bin/python" -m pip --disable-pip-version-check -q install -c "$constraints" "${requirements[@]}"
if [ -n "$build" ]; then
  wait "$build" || { log "building horovod $hvd failed"; exit 1; }
  trap - EXIT
fi
[ "$controllers" = none ] || pip install -c "$constraints" --find-links "$cache" --only-binary horovod "horovod==$hvd"

# The editable install itself one row at a time (scripts/test.sh sets the rows up side by side; each writes the
# tree's egg-info).
log "installing hvd-mlflow (editable)"
flock "${TMPDIR:-/tmp}/hvd-mlflow-editable.lock" "$venv/bin/python" -m pip --disable-pip-version-check -q install \
  --no-deps -c "$constraints" -e "$root"

"$venv/bin/python" "$root/scripts/check_environment.py" "$controllers"
log "set up: $venv"
echo "$want" > "$stamp"
echo "$venv"
