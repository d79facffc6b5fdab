from __future__ import annotations

from hvd_mlflow.delivery.batching import EpochRecord, chunks, metric_requests


def records(n: int, keys: int, start: int = 0) -> list[EpochRecord]:
    return [EpochRecord(s, 1000 + s, {f"m{k}": float(s * k) for k in range(keys)}) for s in range(start, start + n)]


def test_one_epoch_one_request():
    [request] = metric_requests(records(1, 4))
    assert request.completes == 1 and len(request.points) == 4


def test_a_sender_that_fell_behind_packs_epochs():
    requests = list(metric_requests(records(10, 5)))
    assert len(requests) == 1 and requests[0].completes == 10 and len(requests[0].points) == 50


def test_never_more_than_1000_metrics_per_request_and_epochs_stay_whole():
    requests = list(metric_requests(records(10, 300)))
    assert [len(r.points) for r in requests] == [900, 900, 900, 300]
    assert sum(r.completes for r in requests) == 10


def test_one_epoch_over_the_limit_is_sliced():
    requests = list(metric_requests(records(1, 1500)))
    assert [len(r.points) for r in requests] == [1000, 500]
    assert [r.completes for r in requests] == [0, 1]


def test_at_most_250_values_of_one_key_per_request():
    requests = list(metric_requests(records(600, 1)))
    assert [len(r.points) for r in requests] == [250, 250, 100]


def test_every_point_keeps_its_step_and_timestamp():
    points = [p for r in metric_requests(records(3, 2, start=5)) for p in r.points]
    assert points[0] == ("m0", 0.0, 1005, 5)
    assert {(p[3], p[2]) for p in points} == {(5, 1005), (6, 1006), (7, 1007)}


def test_chunks():
    assert [len(c) for c in chunks(list(range(250)))] == [100, 100, 50]
