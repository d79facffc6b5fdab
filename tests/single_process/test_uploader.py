"""The uploader against the real session server: idempotent runs and points."""

from __future__ import annotations

import uuid

import pytest
from mlflow import MlflowClient

from hvd_mlflow.delivery import JOURNAL_ID_TAG, Uploader
from hvd_mlflow.journal import FileJournal, JournalMeta
from hvd_mlflow.limits import MLFLOW

pytestmark = pytest.mark.once  # the command line and the uploader: no Keras in them


def journal_for(tmp_path, url: str, **meta) -> FileJournal:
    journal = FileJournal.create(tmp_path, JournalMeta.new(tracking_uri=url, **meta))
    journal.append("params", {"epochs": "3"})
    for step in range(3):
        journal.append("metrics", {"loss": 1.0 / (step + 1), "acc": step / 3}, step=step, timestamp_ms=1000 + step)
    return journal


def test_upload_twice_adds_nothing_the_second_time(tmp_path, mlflow_server, client: MlflowClient):
    name = f"uploader-{uuid.uuid4().hex[:8]}"
    journal = journal_for(tmp_path, mlflow_server.url, experiment_name=name, final_status="FINISHED")
    uploader = Uploader(journal, client, MLFLOW)
    assert uploader.upload_some() == 4 and uploader.upload_some() == 0
    assert uploader.finish()
    run_id = uploader.run_id
    # a second upload of the same points (as after a lost acknowledgement: the journal still has them pending),
    # really sent (resume="log": the run is not read first), stores nothing new: each point kept its timestamp,
    # and the server drops an exact duplicate
    journal2 = journal_for(tmp_path / "again", mlflow_server.url, run_id=run_id, resume="log")
    sent = []
    counting = _Counting(client, sent)
    Uploader(journal2, counting, MLFLOW).upload_some()
    assert sorted((m.key, m.step, m.timestamp) for m in sent) == sorted(
        (key, step, 1000 + step) for key in ("loss", "acc") for step in range(3)
    )
    for key in ("loss", "acc"):
        assert [m.step for m in client.get_metric_history(run_id, key)] == [0, 1, 2]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"epochs": "3"}


def test_a_run_created_by_an_attempt_whose_answer_was_lost_is_found_again(tmp_path, mlflow_server, client):
    experiment_id = client.create_experiment(f"lost-create-{uuid.uuid4().hex[:8]}")
    journal = journal_for(tmp_path, mlflow_server.url, experiment_id=experiment_id, create_attempted="1")
    existing = client.create_run(experiment_id, tags={JOURNAL_ID_TAG: journal.meta().journal_id})
    uploader = Uploader(journal, client, MLFLOW)
    uploader.upload_some()
    assert uploader.run_id == existing.info.run_id
    assert len(client.search_runs([experiment_id])) == 1


class _Counting:
    """The real client, recording every metric it sends."""

    def __init__(self, client: MlflowClient, sent: list) -> None:
        self._client, self._sent = client, sent

    def log_batch(self, run_id, metrics=(), **kwargs):
        self._sent.extend(metrics)
        return self._client.log_batch(run_id, metrics=metrics, **kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)
