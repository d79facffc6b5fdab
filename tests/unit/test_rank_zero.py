from __future__ import annotations

import pytest

from hvd_mlflow.rank_zero.guard import RankZeroGuard


def test_a_failing_step_is_one_warning_and_only_an_essential_one_turns_logging_off(monkeypatch, caplog):
    monkeypatch.delenv("HVD_MLFLOW_TESTING", raising=False)
    off = []
    guard = RankZeroGuard(logging_off=lambda: off.append(True))
    for _ in range(3):
        with guard.step("params"):
            raise RuntimeError("boom")
    assert off == [] and caplog.text.count("params failed on rank 0 (RuntimeError: boom)") == 1
    with guard.step("the sender", essential=True):
        raise OSError("no thread")
    assert off == [True] and "MLflow logging is off for the rest of this fit" in caplog.text
    assert guard.failed == ["params", "params", "params", "the sender"]


def test_under_the_test_suite_the_guard_re_raises(monkeypatch):
    monkeypatch.setenv("HVD_MLFLOW_TESTING", "1")
    guard = RankZeroGuard(logging_off=lambda: None)
    with pytest.raises(RuntimeError, match="boom"), guard.step("params"):
        raise RuntimeError("boom")
