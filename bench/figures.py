"""Draw docs/overhead.png from the committed paired results in bench/results/ (``python -m bench.figures``).

The picture shows what bench/README.md's targets table says: the realistic model by pairs (each variant's fit
time against no logging), and on the small model's ~40 ms epochs hvd-mlflow head to head against the seed recipe
(and each against no logging). Its sources are the results files the README's results section names that hold a
paired section (``realistic`` or ``small``); each must be committed unchanged, and the picture's caption gives
each file's last commit date. docs/overhead.png.sources.json records the files and their SHA-256
(tests/docs/test_figures.py fails when they no longer match). Nothing is read from the clock.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
README = ROOT / "bench" / "README.md"
PICTURE = ROOT / "docs" / "overhead.png"
SIDECAR = PICTURE.with_name(PICTURE.name + ".sources.json")
COMMAND = "python -m bench.figures"
PAIRED = ("realistic", "small")
SHORT = {
    "hvd": "hvd-mlflow",
    "hvd-mean": 'hvd-mlflow, reduction="mean"',
    "hvd-system": "hvd-mlflow, system_metrics=True",
    "mlflow": "mlflow.tensorflow.autolog() on every rank",
    "seed": "seed recipe (MetricAverageCallback + CSVLogger)",
}
COLOURS = {"hvd": "tab:green", "hvd-mean": "tab:olive", "hvd-system": "tab:cyan", "mlflow": "tab:orange",
           "seed": "tab:blue"}  # fmt: skip
PANELS = (  # section, paired against, title, y label, the added ms labelled too
    ("realistic", "none",
     "Realistic model (~0.4 s epochs), {pairs} pairs of fits per point:\nfit time with / without logging",
     "fit time with / without, per pair: median (marker), min-max (line)", False),
    ("small", "seed",
     "Small model (~40 ms epochs), {pairs} pairs per point:\nhvd-mlflow head to head against the seed recipe",
     "fit time hvd-mlflow / seed recipe (added ms per epoch)", True),
    ("small", "none", "Small model (~40 ms epochs), {pairs} pairs per point:\neach against no logging (the worst case)",
     "fit time with / without", False),
)  # fmt: skip


def named_results(readme: Path = README) -> list[str]:
    """The results files bench/README.md's results section shows: its ``### NAME:`` headings between the
    ``<!-- results -->`` markers (bench/report.py writes one per bench/results/NAME.json)."""
    body = readme.read_text()
    section = body[body.index("<!-- results -->") : body.index("<!-- /results -->")]
    return re.findall(r"^### ([\w.-]+):", section, re.M)


def source_names(readme: Path = README, results: Path = RESULTS) -> list[str]:
    """The named results files that hold a paired section: the picture's sources."""
    names = []
    for name in named_results(readme):
        data = json.loads((results / f"{name}.json").read_text())
        if any(data.get(section) for section in PAIRED):
            names.append(name)
    return names


def sha256(path: Path) -> str:
    """The file's SHA-256, hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def committed_date(path: Path) -> str:
    """The date of the last commit that changed ``path``; an error if it has changes not committed."""
    rel = str(path.relative_to(ROOT))
    dirty = subprocess.run(["git", "status", "--porcelain", "--", rel], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.strip()  # fmt: skip
    date = subprocess.run(["git", "log", "-1", "--format=%cs", "--", rel], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    if dirty or not date:
        raise SystemExit(f"{rel} is not committed as it is: commit the results, then draw the picture from them")
    return date


def rows(results: dict[str, dict], section: str, against: str) -> list[tuple[str, dict]]:
    """(source name, row) of every file's ``section`` paired against ``against``."""
    return [
        (name, row)
        for name, r in results.items()
        for row in r.get(section) or []
        if row.get("against", "none") == against
    ]


def whiskers(ax: Axes, points: list[tuple[float, dict, str, bool]], label_added: bool = False) -> None:
    """Median pair as a marker, min-max pair as a line; hollow markers for the server at nice 19."""
    for x, row, colour, niced in points:
        ax.vlines(x, row["ratio_min"], row["ratio_max"], color=colour, lw=1.2, alpha=0.6)
        ax.plot(x, row["ratio_median"], "o", color=colour, mfc="white" if niced else colour, ms=6, mew=1.5)
        text = f"{row['ratio_median']:.3f}"
        if label_added:
            text += f"\n{row['added_ms_median']:+.1f} ms"
        ax.annotate(text, (x, row["ratio_median"]), xytext=(4, 0), textcoords="offset points", fontsize=6,
                    va="center")  # fmt: skip


def panel(ax: Axes, picked: list[tuple[str, dict]], results: dict[str, dict], title: str, label_added: bool) -> None:
    """One panel: the rows grouped by latency, one slot per (source, variant)."""
    latencies = sorted({row["latency_ms"] for _, row in picked})
    order = list(SHORT)
    slots = sorted(dict.fromkeys((name, row["variant"]) for name, row in picked),
                   key=lambda s: (bool(results[s[0]].get("server_nice")), order.index(s[1])))  # fmt: skip
    width = 0.8 / len(slots)
    points = []
    for name, row in picked:
        i = latencies.index(row["latency_ms"]) + (slots.index((name, row["variant"])) - (len(slots) - 1) / 2) * width
        points.append((i, row, COLOURS[row["variant"]], bool(results[name].get("server_nice"))))
    whiskers(ax, points, label_added)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(latencies)), [f"{lat} ms" for lat in latencies])
    ax.set_xlim(-0.6, len(latencies) - 0.4)
    pairs = "/".join(str(n) for n in sorted({row["pairs"] for _, row in picked}))  # from the results, not assumed
    ax.set(title=title.format(pairs=pairs), xlabel="tracking latency per request")
    ax.title.set_fontsize(9)


def draw(names: list[str], results: dict[str, dict], dates: dict[str, str], path: Path) -> None:
    """The three panels and a caption naming the source files and their commit dates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(1, 3, figsize=(16, 5.4), gridspec_kw={"width_ratios": [1.6, 1, 1.2]})
    for ax, (section, against, title, ylabel, added) in zip(axes, PANELS, strict=True):
        panel(ax, rows(results, section, against), results, title, added)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", lw=0.4, alpha=0.5)
    axes[0].axhline(1.01, color="tab:red", lw=0.8, ls=":", label="target 1.01")
    axes[0].legend(loc="lower right", fontsize=7)
    present = {row["variant"] for r in results.values() for s in PAIRED for row in r.get(s) or []}
    variants = [v for v in SHORT if v in present]
    handles = [Line2D([], [], marker="o", color=COLOURS[v], ls="", label=SHORT[v]) for v in variants]
    handles.append(Line2D([], [], marker="o", color="grey", mfc="white", ls="", label="MLflow server at nice 19"))
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8, frameon=False)
    files = ", ".join(f"{n}.json ({dates[n]})" for n in names)
    caption = f"Drawn by `{COMMAND}` from bench/results/ (last commit dates): {files}."
    fig.text(0.5, 0.01, caption, ha="center", fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.04, 1, 0.93))
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"Title": "hvd-mlflow's overhead (bench/README.md)", "Source": caption, "Software": None}
    fig.savefig(path, dpi=110, metadata=metadata)
    plt.close(fig)


def sidecar(names: list[str], dates: dict[str, str], picture: Path) -> dict:
    """What the picture was drawn from, for tests/docs/test_figures.py."""
    return {
        "picture": str(picture.relative_to(ROOT)),
        "picture_sha256": sha256(picture),
        "command": COMMAND,
        "sources": [
            {"path": f"bench/results/{n}.json", "sha256": sha256(RESULTS / f"{n}.json"), "committed": dates[n]}
            for n in names
        ],
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    names = source_names()
    results = {n: json.loads((RESULTS / f"{n}.json").read_text()) for n in names}
    dates = {n: committed_date(RESULTS / f"{n}.json") for n in names}
    draw(names, results, dates, PICTURE)
    SIDECAR.write_text(json.dumps(sidecar(names, dates, PICTURE), indent=2) + "\n")
    print(f"{PICTURE.relative_to(ROOT)} from {', '.join(names)}; sources in {SIDECAR.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
