"""hvd-mlflow as a pip user gets it: ``pip install .`` into a bare virtual environment (no TensorFlow, no Horovod),
as one adds it to an existing image. Everything it imports must be declared, and what it cannot do must say what
is missing and the pip command that installs it."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.once, pytest.mark.timeout(900)]


def test_a_bare_pip_install_imports_and_says_what_is_missing(tmp_path):
    env_dir = tmp_path / "bare"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # A team on its own MLflow server already has the newest MLflow (3.17.2 on this index): installing hvd-mlflow
    # keeps it (install_requires has no upper cap; the azureml extra keeps azureml-mlflow's own).
    newest = subprocess.run([*pip, "mlflow-skinny==3.17.2"], capture_output=True, text=True, timeout=800)
    assert newest.returncode == 0, newest.stderr[-3000:]
    install = subprocess.run([*pip, str(ROOT)], capture_output=True, text=True, timeout=800)
    assert install.returncode == 0, install.stderr[-3000:]
    kept = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('mlflow-skinny'))"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert kept.stdout.strip() == "3.17.2", kept.stdout + kept.stderr
    script = (
        "import hvd_mlflow\n"
        "try:\n"
        "    hvd_mlflow.autolog()\n"
        "except hvd_mlflow.HvdMlflowError as error:\n"
        "    print('ERROR', error)\n"
    )
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]  # numpy etc. are declared
    said = done.stdout.strip()
    # a Keras is what every job needs (Keras 3 on any backend, or TensorFlow's); Horovod only where a job uses it
    assert said.startswith("ERROR hvd-mlflow needs Keras") and "a Horovod job also needs Horovod" in said, said
    assert "pip install 'keras>=3' 'jax[cpu]'" in said, said
    assert "pip install 'tensorflow-cpu==2.16.2'" in said and "pip install --no-build-isolation" in said, said
    doctor = subprocess.run([str(env_dir / "bin" / "hvd-mlflow"), "doctor"], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)  # fmt: skip
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr, doctor.stdout + doctor.stderr
    fixes = [line.split("->", 1)[1].strip() for line in doctor.stdout.splitlines() if "->" in line]
    assert fixes and all("setup-env" not in fix for fix in fixes), fixes  # a pip user has no clone
    assert any(fix.startswith("pip install") for fix in fixes), fixes
    assert sys.version_info >= (3, 10)
