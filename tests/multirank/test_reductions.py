"""Exact global metrics over uneven shards: the logged value is the metric of all ranks' samples together.

Rank 0 holds 100 training samples and rank 1 37 (validation 50 and 18); the model's learning rate is 0, so its
weights never move and a single-process evaluation of the same weights on the union of the shards is the
truth, computed independently of hvd-mlflow.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from tests.support import launch

pytestmark = [pytest.mark.multirank, pytest.mark.shared, pytest.mark.timeout(600)]
EPOCHS = 2
KEYS = ("loss", "accuracy", "auc", "precision", "recall")


def run(tmp_path, client, server, reduction):
    run_id = client.create_run(client.create_experiment(f"reduce-{uuid.uuid4().hex[:8]}")).info.run_id
    env = {"MLFLOW_TRACKING_URI": server.url, "MLFLOW_RUN_ID": run_id}
    done = launch.run(tmp_path, ["--epochs", str(EPOCHS), "--uneven", "--reduction", reduction], env=env).check()
    logged = {k: [m.value for m in sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)]
              for k in [*KEYS, *(f"val_{k}" for k in KEYS)]}  # fmt: skip
    return done.rank(0), done.rank(1), logged, client.get_run(run_id).data.tags


def test_exact_equals_one_process_on_the_union_of_uneven_shards(tmp_path, mlflow_server, client):
    rank0, rank1, logged, tags = run(tmp_path, client, mlflow_server, "exact")
    assert tags["hvd_mlflow.reduction"] == "exact"
    errors = {}
    for key in KEYS:
        for prefix, truth in (("", rank0["union_train"]), ("val_", rank0["union_val"])):
            values = logged[prefix + key]
            assert len(values) == EPOCHS
            errors[prefix + key] = max(abs(v - truth[key]) for v in values)
            assert values == pytest.approx([truth[key]] * EPOCHS, abs=1e-6), (prefix + key, values, truth[key])
    # and every later callback on every rank saw those values
    for rank in (rank0, rank1):
        assert rank["history"]["val_auc"] == pytest.approx(logged["val_auc"], abs=1e-9)
    # the naive mean would have been wrong here (otherwise this test proves nothing)
    for key, truth in (("precision", rank0["union_train"]), ("val_precision", rank0["union_val"])):
        naive = np.mean([rank0["local"][0][key], rank1["local"][0][key]])
        assert abs(naive - truth["precision"]) > 1e-3, key
    print("max |exact - union| per key:", errors)


@pytest.mark.once  # arithmetic on the ranks' values: tests/multirank/test_conformance.py covers each flavour
def test_mean_is_horovods_unweighted_mean(tmp_path, mlflow_server, client):
    rank0, rank1, logged, tags = run(tmp_path, client, mlflow_server, "mean")
    assert tags["hvd_mlflow.reduction"] == "mean"
    for key in KEYS:
        for prefix in ("", "val_"):
            want = [np.mean([rank0["local"][e][prefix + key], rank1["local"][e][prefix + key]]) for e in range(EPOCHS)]
            assert logged[prefix + key] == pytest.approx(want, rel=1e-12)
    assert abs(logged["precision"][0] - rank0["union_train"]["precision"]) > 1e-3


@pytest.mark.once
def test_weighted_is_exact_for_means_and_not_for_ratios(tmp_path, mlflow_server, client):
    rank0, rank1, logged, _ = run(tmp_path, client, mlflow_server, "weighted")
    n = (100, 37)
    for key in KEYS:
        want = [(rank0["local"][e][key] * n[0] + rank1["local"][e][key] * n[1]) / sum(n) for e in range(EPOCHS)]
        assert logged[key] == pytest.approx(want, rel=1e-6), key
    assert logged["loss"] == pytest.approx([rank0["union_train"]["loss"]] * EPOCHS, abs=1e-6)
    assert logged["accuracy"] == pytest.approx([rank0["union_train"]["accuracy"]] * EPOCHS, abs=1e-6)
