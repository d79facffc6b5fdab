"""Version checks and the support matrix's rows (hvd_mlflow/common/compat.py), and what ``hvd-mlflow doctor`` says of
them."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_mlflow.common import compat
from hvd_mlflow.common.compat import Row, closest_row, known_problems, parse
from hvd_mlflow.common.dependencies import installed_version

REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements"


def pins(row: str) -> dict[str, str]:
    text = (REQUIREMENTS / f"{row}.txt").read_text()
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M))


def test_parse():
    assert parse("3.17.2") == (3, 17, 2) and parse("1.62.0.post6") == (1, 62, 0) and parse("2.16.0rc1") == (2, 16, 0)
    assert parse(None) == () and parse("") == ()


def test_each_row_is_its_requirements_file():
    for row in compat.ROWS:
        pinned = pins(row.name)
        text = (REQUIREMENTS / f"{row.name}.txt").read_text()
        assert pinned.get("tensorflow-cpu", "") == row.tensorflow and pinned["mlflow-skinny"] == row.mlflow, row
        assert pinned.get("azureml-mlflow") == row.azureml_mlflow, row
        directive = re.search(r"^# setup-env:.* python=python(\S+)", text, re.M)  # scripts/setup-env.sh's
        assert (directive.group(1) if directive else "3.11") == row.python, row  # python3.11 when not said
        if row.keras.startswith("tf_keras"):
            assert "tf-keras" in pinned, row
        else:
            assert pinned["keras"].split(".")[0] == row.keras.split()[1], row
    assert [r.name for r in compat.ROWS] == ["tf2.16", "newest", "oldest", "tfdistribute", "jax"]
    oldest = next(r for r in compat.ROWS if r.name == compat.OLDEST)
    assert oldest.mlflow == compat.MLFLOW_FLOOR  # the oldest row tests setup.cfg's lower bound


def test_closest_row_of_environments_users_have():
    plain = Row("here", "", "3.12", "2.18.0", "keras 3", "3.18.0", None)
    assert closest_row(plain) == (compat.ROWS[1], ["Python 3.12 (row: 3.11)", "MLflow 3.18.0 (row: 3.17.2)"])
    older_image = Row("here", "", "3.10", "2.15.0", "keras 2", "2.16.2", "1.58.0")
    assert closest_row(older_image) == (
        compat.ROWS[2],
        ["MLflow 2.16.2 (row: 2.12.2)", "azureml-mlflow 1.58.0 (row: 1.56.0)"],
    )
    azureml = Row("here", "", "3.11", "2.16.1", "tf_keras 2", "3.15.2", "1.62.0.post6")
    assert closest_row(azureml) == (compat.ROWS[0], [])  # the same major.minor everywhere
    keras3_on_azureml_image = Row("here", "", "3.11", "2.16.2", "keras 3", "3.15.0", "1.62.0.post6")
    assert closest_row(keras3_on_azureml_image) == (compat.ROWS[0], ["tf.keras keras 3 (row: tf_keras 2)"])


def test_known_bad_combinations():
    newer_than_plugin = known_problems("3.17.2", "1.62.0.post6", "<=3.15.0", uses_azureml=True)
    assert [fatal for fatal, _ in newer_than_plugin] == [True, False]
    assert newer_than_plugin[0][1].startswith(
        "azureml-mlflow 1.62.0.post6 requires mlflow-skinny<=3.15.0, this is MLflow 3.17.2: "
        "pip install 'mlflow-skinny<=3.15.0'"
    )
    assert newer_than_plugin[1][1].startswith("MLflow 3.17.2 against AzureML: AzureML answers MLflow 3's logged-models")
    assert [fatal for fatal, _ in known_problems("3.15.0", "1.62.0.post6", "<=3.15.0", uses_azureml=False)] == [False]
    assert known_problems("3.15.0", None, None, uses_azureml=True)[0][0] is False  # the URI alone says AzureML
    assert known_problems("2.12.2", "1.56.0", "", uses_azureml=True) == []
    assert known_problems("3.17.2", None, None, uses_azureml=False) == []
    below = known_problems("2.11.3", None, None, uses_azureml=False)
    assert below == [(True, "MLflow 2.11.3 is older than hvd-mlflow supports: pip install 'mlflow-skinny>=2.12.2'")]
    assert compat.outside("3.17.2", "<=3.15.0") and not compat.outside("3.15.0", "<=3.15.0")
    assert not compat.outside("3.17.2", "")


def test_the_installed_plugin_declares_its_mlflow_range():
    declared = {"1.62.0.post6": "<=3.15.0", "1.56.0": "", None: None}
    assert compat.declared_mlflow_range() == declared[installed_version("azureml-mlflow")]


def test_mlflow_version_checks_match_this_mlflow():
    import mlflow
    from mlflow.models.model import ModelInfo

    assert compat.mlflow3() == mlflow.__version__.startswith("3.")
    assert ("logged_model" in compat.accepted(ModelInfo, {"logged_model": None, "nope": 1})) == compat.mlflow3()
    from mlflow.utils.validation import _validate_metric_name

    try:  # MLflow's own check: the truth names_take_colons() reads from the version
        _validate_metric_name("a:b")
        takes = True
    except Exception:  # noqa: BLE001 - MlflowException
        takes = False
    assert compat.names_take_colons() == takes


def this_row() -> Row | None:
    """The row whose requirements file this environment was built from (its pins all installed), if any."""
    python = ".".join(platform.python_version_tuple()[:2])
    for row in compat.ROWS:
        pinned = pins(row.name)
        if (
            row.python == python
            and (installed_version("tensorflow-cpu") or "") == row.tensorflow
            and installed_version("mlflow-skinny") == row.mlflow
            and installed_version("azureml-mlflow") == row.azureml_mlflow
        ):
            assert all(installed_version(name) == version for name, version in pinned.items() if name != "tf-keras")
            return row
    return None


@pytest.mark.timeout(180)
def test_doctor_names_this_environments_row_and_its_known_problems(tmp_path):
    row = this_row()
    if row is None:
        pytest.skip("not one of the support matrix's environments (scripts/setup-env.sh)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "HVD_MLFLOW_", "AZUREML_"))}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([str(Path(sys.executable).parent / "hvd-mlflow"), "doctor"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=150)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    matrix = next(line for line in lines if " support matrix " in line)
    flavour_matches = row.keras.startswith("tf_keras") == (os.environ.get("TF_USE_LEGACY_KERAS") == "1")
    if flavour_matches:
        assert matrix == f"ok support matrix           is row '{row.stands_for}' (requirements/{row.name}.txt)"
    else:  # TF 2.16 with its Keras 3 in the AzureML row's environment
        assert matrix.startswith(f"ok support matrix           closest to row '{row.stands_for}'")
        assert matrix.endswith("; differs in tf.keras keras 3 (row: tf_keras 2)")
    combination = [line for line in lines if " combination " in line]
    if row.azureml_mlflow and parse(row.mlflow) >= (3,):
        assert combination == [f"?? combination              MLflow {row.mlflow} against AzureML"]
        assert "AzureML answers MLflow 3's logged-models API with 404" in done.stdout
    else:
        assert combination == ["ok combination              no known-bad combination of MLflow and azureml-mlflow"]
