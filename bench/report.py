"""Turn bench/results/*.json into the tables of bench/README.md (docs/overhead.png: ``python -m bench.figures``,
once the results are committed)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMES = {
    "none": "no logging",
    "seed": "MetricAverageCallback + rank-0 CSVLogger",
    "mlflow": "mlflow.tensorflow.autolog() on every rank",
    "hvd": "hvd_mlflow.autolog()",
    "hvd-eager": "hvd_mlflow.autolog(), its own functions never traced (always eager)",
    "hvd-mean": 'hvd_mlflow.autolog(reduction="mean")',
    "hvd-system": "hvd_mlflow.autolog(system_metrics=True)",
}


MODELS = {  # bench/paired_worker.py's models
    "realistic": "Realistic model (dense 128-512-512-1 on 4,096 samples per rank, `accuracy` + `AUC`, validation on "
    "512)",
    "small": "Small model (dense 16-16-1 on 64 samples per rank, `accuracy`, 2 steps and validation on 32: the worst "
    "case for per-epoch costs)",
}


def paired(r: dict, section: str) -> list[str]:
    """A paired section's table (``realistic`` or ``small``): each variant against no logging, by pairs of fits
    inside one job, and hvd-mlflow's parts against their floors."""
    rows = r.get(section) or []
    if not rows:
        return []
    lines = [
        f"{MODELS[rows[0].get('model', 'realistic')]}, "
        f"{rows[0]['pairs']} pairs of {rows[0]['epochs_per_fit']}-epoch fits per line, "
        f"{rows[0].get('threads_per_rank', 0) or 'default'} TensorFlow thread(s) per rank"
        + (
            f"; **the MLflow server at nice {r['server_nice']}** (it gets only the CPU the ranks leave idle, the "
            "nearest this machine comes to a server on another host)"
            if r.get("server_nice")
            else ""
        )
        + ":",
        "",
        "| latency | logging | epoch without (or of the other) | added per epoch (median pair) "
        "| ratio (median pair, min-max) "
        "| metric requests / epoch | MLflow server CPU / epoch |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        server = row.get("server_cpu_ms_per_epoch")
        lines.append(
            f"| {row['latency_ms']} ms | {label(row)} | {row['epoch_s_without'] * 1000:.0f} ms "
            f"| {row['added_ms_median']:+.1f} ms | {row['ratio_median']:.3f} ({row['ratio_min']:.3f}-"
            f"{row['ratio_max']:.3f}) | {row['metric_requests_per_epoch']:.2f} "
            f"| {'' if server is None else f'{server:.1f} ms'} |"
        )
    lines += [
        "",
        "hvd-mlflow's parts on the training thread, median ms per epoch (`--profile`; `capture` is the epoch's two "
        "state reads, training and validation, so its floor is two calls; `own`: the epoch end without the wait "
        "for the other rank in the collective, `epoch_end_total - collective + collective_last_rank`, what rank 0's "
        "hvd-mlflow adds to the epoch's critical path; the sender's CPU: mean per epoch):",
        "",
    ]
    lines += ["| latency | " + " | ".join(COLUMNS) + " |", "| --- |" + " --- |" * len(COLUMNS)]
    for row in rows:
        if row["profile_ms"]:
            profile = {**row["profile_ms"], "own_ms": own(row["profile_ms"])}
            cells = [f"{profile.get(part + '_ms', float('nan')):.2f}" for part in COLUMNS]
            lines.append(f"| {row['latency_ms']} ms | " + " | ".join(cells) + " |")
        if row.get("floors_ms"):
            cells = [floor(row["floors_ms"], part) for part in COLUMNS]
            lines.append(f"| its floor ({row['latency_ms']} ms) | " + " | ".join(cells) + " |")
    d = r.get("divergence") if section == "realistic" else None
    if d:
        lines += ["", "- Divergence check (weights fingerprint), per epoch: " + "; ".join(
            f"{size['parameters'] / 1e6:.1f} M parameters {size['median_ms']:.2f} ms (max {size['max_ms']:.2f})"
            for size in d.values()) + "."]  # fmt: skip
    return [*lines, ""]


def floor(floors: dict, part: str) -> str:
    """The floor of ``part`` per epoch (blank for a part without one); ``own``'s: the sum of its parts' floors."""
    if part == "own":
        return f"{sum(floors[FLOORS[p][0]] * FLOORS[p][1] for p in FLOORS if p != 'sender_cpu'):.2f} (sum)"
    if part not in FLOORS:
        return ""
    name, times = FLOORS[part]
    return f"{floors[name] * times:.2f}" + (f" ({times} x {floors[name]:.2f})" if times > 1 else "")


def label(row: dict) -> str:
    """A paired line's variant, and what it was paired with when that is not no logging."""
    against = row.get("against", "none")
    return NAMES[row["variant"]] + ("" if against == "none" else f", **head to head against {NAMES[against]}**")


# the floor each part is held against, measured in the same job (bench/paired_worker.py's Floors): the floor
# measured, and how many of it the part holds per epoch (the capture reads two states: the training state before
# validation, the validation state at the epoch's end)
FLOORS = {
    "capture": ("call_and_transfer_ms", 2),
    "collective_last_rank": ("collective_last_rank_ms", 1),
    "compute": ("call_and_transfer_ms", 1),
    "journal_append": ("write_and_fsync_ms", 1),
    "sender_cpu": ("request_cpu_ms", 1),
}
PARTS = ("capture", "collective", "collective_last_rank", "compute", "journal_append", "epoch_end_total", "sender_cpu")
COLUMNS = (*PARTS[:-1], "own", PARTS[-1])


def own(profile: dict) -> float:
    """Rank 0's epoch end without its wait for the other rank in the collective (that skew, a training without
    logging pays at its next gradient allreduce instead)."""
    nan = float("nan")
    return (
        profile.get("epoch_end_total_ms", nan)
        - profile.get("collective_ms", nan)
        + profile.get("collective_last_rank_ms", nan)
    )


def tables(results: dict[str, dict]) -> str:
    lines = []
    for name, r in results.items():
        env = r["environment"]
        lines += [
            f"### {name}: TensorFlow {env['tensorflow']}, {env['keras']}, Python {env['python']}, {env['cpus']} CPUs",
            "",
            *paired(r, "realistic"),
            *paired(r, "small"),
        ]
        if "overhead" not in r:
            continue
        lines += [
            "| latency | logging | fit time / no logging (median, min-max) | same without the end-of-fit flush | "
            "added per epoch | end-of-fit flush | requests / epoch | points / (metric, epoch) | global values |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        epochs = r.get("epochs", 10 if r["mode"] == "quick" else 60)
        baseline = {row["latency_ms"]: row["fit_seconds_median"] for row in r["overhead"] if row["variant"] == "none"}
        for row in r["overhead"]:
            added = row["fit_seconds_median"] - baseline[row["latency_ms"]] - row["end_of_fit_flush_s_median"]
            is_global = "-" if row["values_global"] is None else row["values_global"]
            lines.append(
                f"| {row['latency_ms']} ms | {NAMES[row['variant']]} | {row['fit_ratio_median']:.3f} "
                f"({row['fit_ratio_min']:.3f}-{row['fit_ratio_max']:.3f}) | {row['fit_ratio_without_end_flush']:.3f} "
                f"| {added / epochs * 1000:.1f} ms | {row['end_of_fit_flush_s_median']:.2f} s "
                f"| {row['requests_per_epoch']:.2f} | "
                f"{row['points_per_metric_epoch']:.2f} | {is_global} |"
            )
        if r.get("batch_logging"):
            lines += [
                "",
                "| per-batch logging (16 batches per epoch, no latency) | fit time / no logging | added per batch vs "
                "epoch logging only | `batch/loss` points (expected) |",
                "| --- | --- | --- | --- |",
            ]
            for row in r["batch_logging"]:
                label = "no logging" if row["variant"] == "none" else (
                    f"`log_every_n_steps={row['log_every_n_steps']}`" if row["log_every_n_steps"]
                    else "hvd_mlflow.autolog(), epochs only")  # fmt: skip
                lines.append(
                    f"| {label} | {row['ratio_vs_none']:.3f} | {row['added_ms_per_batch_vs_epoch_only']:.2f} ms "
                    f"| {row['batch_points']} ({row['batch_points_expected']}) |"
                )
        if "reduction_us" not in r:  # an overhead-only run (bench.run --only overhead)
            lines.append("")
            continue
        lines += [
            "",
            "| metric keys | one fused collective | one allreduce per key | speed-up |",
            "| --- | --- | --- | --- |",
        ]
        for keys, red in r["reduction_us"].items():
            lines.append(f"| {keys} | {red['fused']:.0f} µs | {red['per_key']:.0f} µs | {red['speedup']:.0f}x |")
        v, m = r["visibility"], r["memory"]
        rss = ", ".join(f"{s['rss_mb']:.0f} MB after {s['epoch']}" for s in m["samples"])
        slope = m.get("slope")
        slope = (f" ({slope['bytes_per_epoch']:+.0f} bytes per epoch after the first {slope['warmup_epochs']}, "
                 f"{m['epoch_s'] * 1000:.0f} ms apart; the sender failed {m['sender_failures']} attempts)"
                 if slope else "")  # fmt: skip
        sync = ("not run (quick)" if m["sync_s"] is None else
                f"then uploaded it in {m['sync_s']:.0f} s ({m['points_after_sync']} points per metric)")  # fmt: skip
        lines += [
            "",
            f"- Epoch end to point readable on the server: median {v['median_s'] * 1000:.0f} ms, "
            f"max {v['max_s'] * 1000:.0f} ms ({v['samples']} samples, healthy local server).",
            f"- Server down for {m['epochs']} epochs x {m['metrics']} metrics: rank 0's resident memory {rss} "
            f"epochs{slope}; journal {m['journal_mb']:.1f} MB; {m['append_ms']:.2f} ms per journaled epoch; "
            f"`hvd-mlflow sync` {sync}.",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--no-write", action="store_true", help="print the tables only")
    args = parser.parse_args()
    results = {p.stem: json.loads(p.read_text()) for p in sorted(args.folder.glob("*.json"))}
    text = tables(results)
    print(text)
    if args.no_write:
        return
    readme = ROOT / "bench" / "README.md"
    body = readme.read_text()
    body = re.sub(r"(<!-- results -->\n).*(<!-- /results -->)", lambda m: m[1] + text + "\n" + m[2], body, flags=re.S)
    readme.write_text(body)
    print("docs/overhead.png: commit bench/results/, then python -m bench.figures")


if __name__ == "__main__":
    main()
