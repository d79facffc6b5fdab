"""Cut what rank 0 has to send into ``log_batch`` requests that every server accepts.

MLflow refuses more than 1000 metrics or 100 params + tags in one request; AzureML also refuses more than
250 values of one metric key. Consecutive epochs are packed together (that is how a sender that fell behind
catches up with few requests), and an epoch is never split unless it alone is over a limit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar

from .limits import MLFLOW

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class EpochRecord:
    """The global values of one step, as measured: its timestamp never changes, so a resend is the same
    point, not a new one."""

    step: int
    timestamp_ms: int
    metrics: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class MetricsRequest:
    """Points of one or more records; ``completes`` is how many records from the head it finishes."""

    points: list[tuple[str, float, int, int]]  # key, value, timestamp_ms, step
    completes: int


def metric_requests(
    records: Sequence[EpochRecord],
    max_metrics: int = MLFLOW.metrics_per_request,
    max_values_per_key: int = MLFLOW.values_per_key_per_request,
) -> Iterator[MetricsRequest]:
    """Requests that deliver ``records`` in order, within the limits."""
    points: list[tuple[str, float, int, int]] = []
    completes = 0
    for record in records:
        items = [(k, float(v), record.timestamp_ms, record.step) for k, v in record.metrics.items()]
        if points and (len(points) + len(items) > max_metrics or completes >= max_values_per_key):
            yield MetricsRequest(points, completes)
            points, completes = [], 0
        while len(items) > max_metrics:  # one record over the limit on its own (points is empty): in slices
            yield MetricsRequest(items[:max_metrics], 0)
            items = items[max_metrics:]
        points.extend(items)
        completes += 1
    if points or completes:
        yield MetricsRequest(points, completes)


def chunks(items: Sequence[T], size: int = MLFLOW.params_tags_per_request) -> Iterator[list[T]]:
    """``items`` in lists of at most ``size``."""
    for start in range(0, len(items), size):
        yield list(items[start : start + size])
