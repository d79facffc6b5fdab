"""The model upload ends with ``fit``: the run holds the model whole or not at all, and no thread is left on it.

A slow artifact store (every artifact upload is stored at once and answered 30 s later, far beyond the model's share
of ``flush_timeout``), then a second ``fit`` that changes the weights. The truth: the model's predictions on 4 probe
inputs right after each ``fit`` returned, and the files on the server's artifact store.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from hvd_mlflow.common import compat
from hvd_mlflow.rank_zero import model_logging
from tests.support import launch
from tests.support.proxy import Proxy, Recorded

pytestmark = [pytest.mark.multirank, pytest.mark.oldest, pytest.mark.timeout(600)]
WORKER = Path(__file__).resolve().parent.parent / "workers" / "model_upload_worker.py"
FLUSH_TIMEOUT = 16.0  # the model's share: 11 s (5 s are kept for the last epochs), saving takes 1-4 s here
LATE_S = 60.0
THREAD = "hvd-mlflow-model"  # model_logging.THREAD_NAME (the upload thread had that name before it too)
COPY = re.compile(r"The whole saved copy is in (\S+);")


class LateAnswers(Proxy):
    """A slow artifact store: an artifact upload is applied at once, its answer comes ``LATE_S`` later."""

    def _forward(self, request: Recorded) -> tuple[int, dict[str, str], bytes]:
        answer = super()._forward(request)
        if request.method == "PUT" and "/mlflow-artifacts/artifacts/" in request.path:
            time.sleep(LATE_S)
        return answer


def predictions(model, probe_x: list) -> list[float]:
    return np.asarray(model.predict(np.asarray(probe_x, dtype="float32"), verbose=0)).ravel().tolist()


def stored_model_files(artifacts: Path, experiment_id: str, run_ids: list[str]) -> list[Path]:
    """The model files on the server's artifact store: logged models' (MLflow 3), the runs' ``model/`` (2.x)."""
    roots = [
        artifacts / experiment_id / "models",
        *(artifacts / experiment_id / r / "artifacts" / "model" for r in run_ids),
    ]
    return sorted(p for root in roots if root.exists() for p in root.rglob("*") if p.is_file())


def test_a_slow_store_leaves_the_first_fits_model_whole_or_none_and_no_thread(tmp_path, mlflow_server, client,
                                                                              keras_mode):  # fmt: skip
    if keras_mode == "tf_keras":  # CI time: the upload is the same code in every row (the save per flavour: below)
        pytest.skip("runs in the newest (Keras 3, MLflow 3) and oldest (Keras 2, MLflow 2) rows; tf_keras' save: "
                    "test_models.py")  # fmt: skip
    import mlflow.tensorflow

    experiment_id = client.create_experiment(f"model-upload-{uuid.uuid4().hex[:8]}")
    # the job's run, given (as in an AzureML job): the model never waits for the run to be opened, both fits log there
    run_id = client.create_run(experiment_id).info.run_id
    with LateAnswers(mlflow_server.url) as proxy:
        env = {"MLFLOW_TRACKING_URI": proxy.url, "MLFLOW_RUN_ID": run_id, "HVD_MLFLOW_LOG_MODELS": "1",
               "HVD_MLFLOW_FLUSH_TIMEOUT": str(FLUSH_TIMEOUT), "TMPDIR": str(tmp_path)}  # fmt: skip
        done = launch.run(tmp_path, env=env, horovodrun=False, worker=WORKER).check()
        uploads = [r for r in proxy.requests if r.method == "PUT" and "/mlflow-artifacts/artifacts/" in r.path]
    record = done.rank(0)
    fit1, fit2 = record["fit1"], record["fit2"]
    assert not np.allclose(fit1["probe_y"], fit2["probe_y"])  # the second fit changed the weights
    for fit in (fit1, fit2):
        assert THREAD not in fit["threads"]  # nothing works on the model once fit returned
        assert fit["end_s"] <= FLUSH_TIMEOUT + 2, fit["end_s"]  # the upload included: the end within its budget
    runs = client.search_runs([experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]
    files = stored_model_files(mlflow_server.workdir / "artifacts", experiment_id, [r.info.run_id for r in runs])
    mlflow.set_tracking_uri(mlflow_server.url)
    if compat.mlflow3():
        from mlflow.entities import LoggedModelStatus

        models = sorted(client.search_logged_models(experiment_ids=[experiment_id]), key=lambda m: m.creation_timestamp)
        assert all(m.status == LoggedModelStatus.READY for m in models), [
            (m.model_id, m.status) for m in models
        ]  # none half-way
        uris = [m.model_uri for m in models]
    else:
        uris = [f"runs:/{r.info.run_id}/model" for r in runs if client.list_artifacts(r.info.run_id, "model")]
    if uris:  # whole, and the first fit's (never the live model the second fit changed)
        uri = uris[0]
        loaded = mlflow.tensorflow.load_model(uri)
        assert predictions(loaded, record["probe_x"]) == pytest.approx(fit1["probe_y"], rel=1e-5, abs=1e-6)
        return
    assert uploads, "the upload never reached the store: the slow store was not tried"
    assert files == [], files  # no half-uploaded model: what was stored is removed again
    [said] = [m for m in fit1["warnings"] if "the model was not logged" in m]  # one warning for the first fit
    assert run_id in said
    copy = Path(COPY.search(said).group(1))
    assert f"mlflow.log_artifacts('{copy}', artifact_path='model')" in said  # how to log it by hand
    loaded = mlflow.tensorflow.load_model(str(copy))  # the saved copy: the first fit's weights, whole
    assert predictions(loaded, record["probe_x"]) == pytest.approx(fit1["probe_y"], rel=1e-5, abs=1e-6)


def test_with_no_time_left_nothing_is_saved_or_started(tmp_path, monkeypatch, caplog):
    """A budget of 0 or less at that point: the model is not read, no copy is written, no thread is started."""

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the model was read ({name})")

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    threads = {t.name for t in threading.enumerate()}
    with caplog.at_level(logging.WARNING, logger="hvd_mlflow"):
        for timeout in (0.0, -3.0):
            assert (
                model_logging.log_model(Untouchable(), "0123abcd", "keras", as_artifacts=False, timeout=timeout)
                is False
            )
    assert list(tmp_path.iterdir()) == []
    assert {t.name for t in threading.enumerate()} == threads
    said = [r.getMessage() for r in caplog.records if "the model was not logged" in r.getMessage()]
    assert len(said) == 2 and all("nothing was saved" in m for m in said), said


def test_the_entry_files_go_up_last(tmp_path):
    """A loader's first file is sent only once every file it needs was acknowledged."""
    from hvd_mlflow.delivery.model_upload import upload_order

    names = ["MLmodel", "conda.yaml", "data/model/saved_model.pb", "data/model/variables/variables.index",
             "saved_model/saved_model.pb", "model.keras", "saved_model/fingerprint.pb"]  # fmt: skip
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    order = [p.relative_to(tmp_path).as_posix() for p in upload_order(tmp_path)]
    assert order[-4:] == ["data/model/saved_model.pb", "saved_model/saved_model.pb", "model.keras", "MLmodel"]
    assert sorted(order[:-4]) == ["conda.yaml", "data/model/variables/variables.index", "saved_model/fingerprint.pb"]
