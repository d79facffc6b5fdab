from __future__ import annotations

from hvd_mlflow.sender import Backoff


def test_backoff_grows_and_opens_the_circuit():
    backoff = Backoff(first=1, maximum=8)
    assert [backoff.failed() for _ in range(5)] == [1, 2, 4, 8, 8]
    assert backoff.is_open
    assert backoff.succeeded() is True and not backoff.is_open and backoff.wait_time() == 0
