"""Training curves of a run as a PNG, train and validation of each metric on one chart (as Studio shows them)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


def curves(client: Any, run_id: str, metrics: Iterable[str] | None = None) -> dict[str, dict[str, list]]:
    """``{chart: {key: [(step, value), ...]}}``: each metric with its ``val_`` twin on one chart."""
    keys = sorted(metrics or client.get_run(run_id).data.metrics)
    charts: dict[str, dict[str, list]] = {}
    for key in keys:
        chart = key[4:] if key.startswith("val_") else key
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        charts.setdefault(chart, {})[key] = history
    return charts


def save_png(charts: dict[str, dict[str, list]], path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, max(1, len(charts)))
    rows = (len(charts) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.2 * rows), squeeze=False)
    for ax, (chart, series) in zip(axes.flat, charts.items(), strict=False):
        for key, points in series.items():
            ax.plot([s for s, _ in points], [v for _, v in points], marker="o", ms=3, label=key)
        ax.set(title=chart, xlabel="epoch (step)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(charts) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
