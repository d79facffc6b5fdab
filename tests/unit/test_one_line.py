"""Errors in hvd-mlflow's messages are one readable line; the whole error goes to debug level."""

from __future__ import annotations

import logging

import pytest

from hvd_mlflow._log import one_line
from hvd_mlflow.rank_zero.guard import RankZeroGuard


def tensorflow_graph_error() -> BaseException:
    """A real TensorFlow error from a compiled function: its message holds the node trace over several lines."""
    tf = pytest.importorskip("tensorflow")

    @tf.function
    def gather(x):
        return tf.gather(x, [0, 7])

    try:
        gather(tf.constant([1.0, 2.0]))
    except Exception as error:  # noqa: BLE001 - the error is what is tested
        return error
    raise AssertionError("no error")


def test_tensorflow_s_node_trace_becomes_its_first_and_last_meaningful_lines():
    error = tensorflow_graph_error()
    assert "\n" in str(error) and 'File "' in str(error)  # what it was: a multi-line trace
    line = one_line(error)
    assert line == "InvalidArgumentError: Graph execution error: ... indices[1] = 7 is not in [0, 2)", line


def test_a_plain_message_stays_whole_and_secrets_and_length_are_bounded(monkeypatch):
    assert one_line(ValueError("bad value")) == "ValueError: bad value"
    assert one_line(RuntimeError()) == "RuntimeError"
    assert one_line(OSError("cannot reach https://user:hunter2@host/x")) == "OSError: cannot reach https://***@host/x"
    long = one_line(RuntimeError("x" * 1000), limit=50)
    assert len(long) == len("RuntimeError: ") + 50 and long.endswith("...")


def test_the_guard_warns_in_one_line_and_keeps_the_whole_error_at_debug(monkeypatch, caplog):
    monkeypatch.setenv("HVD_MLFLOW_TESTING", "0")
    guard = RankZeroGuard(logging_off=lambda: None)
    with caplog.at_level(logging.DEBUG, logger="hvd_mlflow"):
        with guard.step("the CSV file"):
            raise tensorflow_graph_error()
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "\n" not in warning.getMessage() and "indices[1] = 7 is not in [0, 2)" in warning.getMessage()
    [debug] = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug.exc_info is not None and "Detected at node" in str(debug.exc_info[1])
