"""Exact for every metric Keras users compile: each logged value against a one-process evaluation of the same
weights on the union of the ranks' samples (tests/workers/conformance_worker.py computes that truth without
hvd-mlflow). Uneven shards (100 and 37 training samples, 50 and 18 validation), a learning rate of 0.

The table in docs/reductions.md (metric x Keras mode x exact/weighted) is checked against what these tests find.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.support import launch
from tests.support.checks import report

pytestmark = [pytest.mark.multirank, pytest.mark.oldest, pytest.mark.timeout(900)]

WORKER = launch.WORKER.parent / "conformance_worker.py"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "reductions.md"
EPOCHS = 4
TRAIN, VAL = (100, 37), (50, 18)  # as in tests/workers/conformance_worker.py
STEPS = 3  # its training steps per epoch on every rank
REL = 1e-6
# the one metric whose state does not add up (a running maximum): its global value is the sample-weighted mean
NOT_ADDITIVE = re.compile(r"(^|_)max_err$")


@pytest.fixture(scope="module")
def conformance(tmp_path_factory, mlflow_server):
    out = tmp_path_factory.mktemp("conformance")
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_EXPERIMENT_NAME": f"conformance-{out.name}"}
    done = launch.run(out, ["--epochs", str(EPOCHS)], worker=WORKER, env=env, timeout=800).check()
    return done, [done.rank(0), done.rank(1)]


def weighted_mean(ranks: list[dict], scenario: str, key: str, epoch: int, counts: tuple[int, int]) -> float:
    values = [r["scenarios"][scenario]["local"][epoch][key] for r in ranks]
    return float(np.dot(values, counts) / sum(counts))


BATCH = 16  # the worker's validation batch size (training: STEPS batches on every rank)
# Keras 3 (3.15 here; 3.3 logged no per-output loss) keeps an output's loss in a Mean updated once per batch with the
# batch's static size as weight (keras/src/trainers/compile_utils.py): unknown, so 1, when a rank's samples do not
# divide into its batches (as on both ranks here; a rank whose batches all have one size weighs each by it): a mean
# over batches. One process on the union batches other samples together, so the truth for it is the mean over every
# rank's batches: each rank's own Keras value weighted by its number of batches.
OUTPUT_LOSS = re.compile(r"^(val_)?(?!val_)[a-z0-9]+_loss$")


def over_batches(keras_mode: str, key: str) -> bool:
    import keras

    return keras_mode == "keras" and int(keras.__version__.split(".")[0]) >= 3 and bool(OUTPUT_LOSS.match(key))


SCENARIOS = ["multi_output", "classification", "weighted", "class_weighted", "schedule", "custom", "small_val"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_value_equals_one_process_on_the_union(conformance, scenario, keras_mode, client, mlflow_server):
    done, ranks = conformance
    rank0 = ranks[0]["scenarios"][scenario]
    history = rank0["history"]
    worst: dict[str, float] = {}
    checked = 0
    for key, values in history.items():
        if key in ("learning_rate",):
            continue
        validation = key.startswith("val_")
        truth = rank0["union_val" if validation else "union_train"]
        name = key[4:] if validation else key
        epochs = [e for e in range(EPOCHS) if not (scenario == "schedule" and validation and e % 2 == 0)]
        assert len(values) == len(epochs), (key, values)  # validation_freq=2: val_ keys at epochs 1 and 3 only
        for value, epoch in zip(values, epochs, strict=True):
            if NOT_ADDITIVE.search(name):
                want = weighted_mean(ranks, scenario, key, epoch, VAL if validation else TRAIN)
            elif over_batches(keras_mode, key):
                batches = tuple(-(-n // BATCH) for n in VAL) if validation else (STEPS,) * len(TRAIN)
                want = weighted_mean(ranks, scenario, key, epoch, batches)
            else:
                want = truth[name]
            assert value == pytest.approx(want, rel=REL, abs=1e-7), (scenario, key, epoch, value, want)
            worst[key] = max(worst.get(key, 0.0), abs(value - want) / max(abs(want), 1e-12))
            checked += 1
        for other in ranks[1:]:  # every rank's callbacks saw the same global values
            assert other["scenarios"][scenario]["history"][key] == pytest.approx(values, rel=1e-12)
    assert checked >= 2 * EPOCHS
    report(f"conformance_{scenario}_{keras_mode}", worst_relative_error=max(worst.values()), keys=sorted(worst),
           values_checked=checked)  # fmt: skip


def run_of(client, scenario: str):
    experiments = [e.experiment_id for e in client.search_experiments() if e.name.startswith("conformance-")]
    [run] = client.search_runs(experiments, filter_string=f"tags.conformance = '{scenario}'")
    return run


INEXACT = {
    "custom": ["max_err", "val_max_err"],
    "multi_output": ["a_max_err", "b_max_err", "val_a_max_err", "val_b_max_err"],
}


@pytest.mark.parametrize("scenario, inexact", list(INEXACT.items()))
def test_a_metric_whose_state_does_not_add_up_is_found_by_its_keras_names_and_tagged(
    conformance, client, scenario, inexact
):
    """Keras 3 names a two-head model's metrics <output>_<metric>: the running maximum is found by those names
    (before, its summed state was used on Keras 3: 1.633 logged where the union's maximum was 0.817); the
    fallback is tagged in the run, and the warning is said on the first fit."""
    done, ranks = conformance
    assert run_of(client, scenario).data.tags["hvd_mlflow.inexact_keys"].split(",") == inexact
    # the first fit (multi_output) warns, once, naming the keys as Keras reports them; a later fit with the same
    # metric (custom) is not warned about again in the same process
    warnings = [line for line in done.output.splitlines() if "keep a state that may not add up" in line]
    assert sum("a_max_err, b_max_err" in line for line in warnings) == 1, warnings


def test_a_declared_additive_custom_metric_is_exact(conformance):
    """A counter that declares ``hvd_mlflow_additive = True`` (keras-team/keras#21054): the union's count."""
    done, ranks = conformance
    custom = ranks[0]["scenarios"]["custom"]
    assert custom["history"]["positives"] == [custom["union_train"]["positives"]] * EPOCHS
    assert custom["history"]["positives"][0] != pytest.approx(weighted_mean(ranks, "custom", "positives", 0, TRAIN))
    assert "positives" not in run_tags_text(done)


def run_tags_text(done) -> str:
    return " ".join(line for line in done.output.splitlines() if "keep a state" in line)


def test_the_docs_table_says_what_the_tests_found(conformance, client):
    """docs/reductions.md lists each metric family with exact/weighted: it must agree with what was measured. Every
    key is exact (equal to one process on the union: the test above) except those each scenario's run tags as the
    weighted mean (``hvd_mlflow.inexact_keys``); those must be the running maximum's and nothing else, and the
    table's one weighted row is that metric's."""
    done, ranks = conformance
    weighted: set[str] = set()
    for scenario in SCENARIOS:
        tagged = set(filter(None, run_of(client, scenario).data.tags.get("hvd_mlflow.inexact_keys", "").split(",")))
        history = ranks[0]["scenarios"][scenario]["history"]
        assert tagged == {k for k in history if NOT_ADDITIVE.search(k)}, (scenario, tagged)
        weighted |= tagged
    assert weighted and all("max_err" in key for key in weighted), weighted
    text = DOCS.read_text()
    rows = dict(re.findall(r"^\| `([^`]+)` \| [^|]* \| (exact|weighted) \|", text, flags=re.M))
    assert rows, "docs/reductions.md has no metric table"
    assert [metric for metric, reduction in rows.items() if reduction == "weighted"] == [
        "MaxAbsError (a running maximum, your code)"
    ], rows


GOLDEN_RANKS = 8


@pytest.mark.once
def test_the_golden_uneven_case_44_validation_samples_over_8_ranks(tmp_path, mlflow_server):
    """Lightning-AI/pytorch-lightning#21859: 44 validation samples over 8 ranks (6,6,6,6,5,5,5,5), oversubscribed
    on 2 cores with a tiny model. Every val_ value is the union's; the plain mean of the ranks' values is shown
    for contrast (what averaging the ranks' metrics, as Horovod's MetricAverageCallback does, would log)."""
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_EXPERIMENT_NAME": f"golden-{tmp_path.name}"}
    done = launch.run(tmp_path, ["--golden", "--epochs", "2"], np=GOLDEN_RANKS, worker=WORKER, env=env,
                      timeout=400).check()  # fmt: skip
    ranks = [done.rank(r)["scenarios"]["golden"] for r in range(GOLDEN_RANKS)]
    assert ranks[0]["val_counts"] == [6, 6, 6, 6, 5, 5, 5, 5]
    truth = ranks[0]["union_val"]
    shown = {}
    for key in ("val_loss", "val_accuracy", "val_auc", "val_precision"):
        exact = ranks[0]["history"][key]
        assert exact == pytest.approx([truth[key[4:]]] * 2, rel=REL), key
        plain = float(np.mean([r["local"][0][key] for r in ranks]))
        shown[key] = {"exact": exact[0], "union": truth[key[4:]], "plain_mean_of_ranks": plain}
    assert any(abs(v["plain_mean_of_ranks"] - v["union"]) > 1e-3 for v in shown.values())
    print("golden 44 over 8:", json.dumps(shown, indent=1))
    report("conformance_golden_8", ranks=GOLDEN_RANKS, seconds=round(done.seconds, 1), values=shown)
