from __future__ import annotations

import math
import threading

import pytest
from mlflow.utils.validation import _validate_metric_name

from hvd_mlflow.journal import DELIVERED, REJECTED, Journal, find
from hvd_mlflow.names import MetricNameCollisionError, NameMap, clean
from hvd_mlflow.sender import Backoff


def test_entries_survive_reopen_in_order_and_acknowledgements_stick(tmp_path):
    journal = Journal.create(tmp_path, {"tracking_uri": "http://x"})
    seqs = [journal.append("metrics", {"loss": 1.0 / (s + 1)}, step=s, timestamp_ms=100 + s) for s in range(5)]
    journal.acknowledge(seqs[:2])
    journal.close()
    again = Journal.open(find(tmp_path)[0])
    assert [e.step for e in again.pending()] == [2, 3, 4]
    assert again.count(DELIVERED) == 2
    assert again.meta()["tracking_uri"] == "http://x" and again.meta()["journal_id"]
    again.acknowledge([seqs[2]], state=REJECTED)
    assert again.count() == 2 and again.count(REJECTED) == 1


def test_journal_file_is_owner_only(tmp_path):
    journal = Journal.create(tmp_path / "j", {})
    assert journal.path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "j").stat().st_mode & 0o777 == 0o700


def test_nan_and_inf_round_trip(tmp_path):
    journal = Journal.create(tmp_path, {})
    journal.append("metrics", {"a": float("nan"), "b": float("inf"), "c": -float("inf")}, step=0, timestamp_ms=1)
    payload = journal.pending()[0].payload
    assert math.isnan(payload["a"]) and payload["b"] == math.inf and payload["c"] == -math.inf


def test_in_memory_journal_is_shared_between_threads():
    journal = Journal.in_memory({"k": "v"})
    journal.append("params", {"p": "1"})
    seen = []
    thread = threading.Thread(target=lambda: seen.append(journal.reopen().pending()))
    thread.start()
    thread.join()
    assert seen[0][0].payload == {"p": "1"}


@pytest.mark.parametrize(
    "name, expected",
    [("val_loss", "val_loss"), ("acc@5", "acc_5"), ("f(1)", "f_1_"), ("précision", "précision"),
     ("a//b", "a/b"), ("/abs", "abs"), ("..", "_"), ("top 1/err:x", "top 1/err:x")],
)  # fmt: skip
def test_clean_names_are_accepted_by_mlflow(name, expected):
    assert clean(name) == expected
    _validate_metric_name(clean(name))


def test_long_names_are_cut_to_the_limit():
    assert len(clean("x" * 300)) == 250


def test_two_names_cleaning_to_one_is_an_error():
    with pytest.raises(MetricNameCollisionError, match="'a@b', 'a#b' -> 'a_b'"):
        NameMap()(["a@b", "a#b", "ok"])


def test_backoff_grows_and_opens_the_circuit():
    backoff = Backoff(first=1, maximum=8)
    assert [backoff.failed() for _ in range(5)] == [1, 2, 4, 8, 8]
    assert backoff.is_open
    assert backoff.succeeded() is True and not backoff.is_open and backoff.wait_time() == 0
