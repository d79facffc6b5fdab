"""Exact under tf.distribute, counted once: every logged value against plain Keras in one process on the union of the
workers' data (tests/workers/tfd_worker.py computes that truth without hvd-mlflow, outside the strategy).

Two workers (MultiWorkerMirroredStrategy, tf_keras), uneven data (each of worker 0's batches holds twice worker 1's:
96 and 48 training samples, 36 and 15 validation), a learning rate of 0 (the weights never move: every epoch's and
batch's value has its truth), ``log_every_n_steps=2``. Keras itself sums the metric states over workers when it reads
them at epoch end, so its own epoch values are right wherever a state adds up; hvd-mlflow must not count them twice,
must stay exact where Keras' value is wrong (a counter read with ``aggregation=mean``, as in tensorflow#64471: Keras
halves it), and must log each batch's global value where Keras' batch logs hold the sum over workers. A metric whose
state does not add up (a running maximum) is the sample-weighted mean of the workers' own values, as under Horovod.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.support import tf_workers
from tests.support.checks import report

pytestmark = [pytest.mark.tfdistribute, pytest.mark.timeout(900)]

EPOCHS, STEPS, EVERY = 2, 6, 2
BATCH, VAL_BATCH, VAL_STEPS = (16, 8), (12, 5), 3
TRAIN = tuple(b * STEPS for b in BATCH)
VAL = tuple(b * VAL_STEPS for b in VAL_BATCH)
SCENARIOS = ["classification", "multi_output", "weighted", "custom"]
NOT_ADDITIVE = re.compile(r"(^|_)max_err$")
REL = 1e-6


@pytest.fixture(scope="module")
def exact(tmp_path_factory, mlflow_server):
    out = tmp_path_factory.mktemp("tfd-exact")
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_EXPERIMENT_NAME": f"tfd-exact-{out.name}"}
    args = ["--scenarios", ",".join(SCENARIOS), "--lr0", "--epochs", str(EPOCHS),
            "--autolog-options", f'{{"log_every_n_steps": {EVERY}}}']  # fmt: skip
    done = tf_workers.run(out, args, env=env, timeout=800).check()
    return done, [done.rank(0), done.rank(1)], env["MLFLOW_EXPERIMENT_NAME"]


def run_of(client, experiment: str, scenario: str):
    [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id],
                               filter_string=f"tags.scenario = '{scenario}'")  # fmt: skip
    return run


def want(ranks: list[dict], scenario: str, key: str, part: str, counts: tuple[int, ...], batch: int = -1) -> float:
    """The truth of ``key``: one process on the union, or the weighted mean of the workers' own (not additive)."""
    name = key[4:] if key.startswith("val_") else key
    if NOT_ADDITIVE.search(name):
        own = [r["scenarios"][scenario][f"own_{part}"] for r in ranks]
        values = [o[batch][name] if batch >= 0 else o[name] for o in own]
        return float(np.dot(values, counts) / sum(counts))
    union = ranks[0]["scenarios"][scenario][f"union_{part}"]
    return union[batch][name] if batch >= 0 else union[name]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_epoch_value_is_the_union_s_once_logged_by_the_chief(exact, scenario, client):
    done, ranks, experiment = exact
    run = run_of(client, experiment, scenario)
    history = ranks[0]["scenarios"][scenario]["history"]
    worst, keras_worst, checked = {}, {}, 0
    for key in history:
        if key == "learning_rate":
            continue
        validation = key.startswith("val_")
        points = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert [s for s, _ in points] == list(range(EPOCHS)), (key, points)  # one point per epoch
        for epoch, value in points:
            truth = want(ranks, scenario, key, "val" if validation else "train", VAL if validation else TRAIN)
            assert value == pytest.approx(truth, rel=REL, abs=1e-7), (scenario, key, epoch, value, truth)
            worst[key] = max(worst.get(key, 0.0), abs(value - truth) / max(abs(truth), 1e-12))
            keras = ranks[0]["scenarios"][scenario]["keras_own"][epoch][key]
            keras_worst[key] = max(keras_worst.get(key, 0.0), abs(keras - truth) / max(abs(truth), 1e-12))
            checked += 1
        for other in ranks[1:]:  # every worker's later callbacks saw the same global values
            assert other["scenarios"][scenario]["history"][key] == pytest.approx(history[key], rel=1e-12), key
    if scenario == "custom":  # where Keras itself is wrong under the strategy, and hvd-mlflow is not
        assert keras_worst["positives_mean_read"] == pytest.approx(0.5, rel=1e-6)  # the mean of 2 counts: half
        assert keras_worst["positives"] < REL and worst["positives_mean_read"] < REL
        assert keras_worst["max_err"] > 0.01  # Keras adds the maxima up
        assert run.data.tags["hvd_mlflow.inexact_keys"] == "max_err,val_max_err"
    assert run.data.tags["hvd_mlflow.engine"] == "tf.distribute" and run.data.tags["hvd_mlflow.world_size"] == "2"
    assert checked >= 2 * EPOCHS
    report(f"tfd_exact_{scenario}", worst_relative_error=worst, keras_worst_relative_error=keras_worst,
           values_checked=checked)  # fmt: skip


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_logged_batch_is_the_global_value_where_keras_reports_the_sum_over_workers(exact, scenario, client):
    done, ranks, experiment = exact
    run = run_of(client, experiment, scenario)
    keras_batches = ranks[0]["scenarios"][scenario]["keras_batches"]
    worst, keras_ratio, checked = {}, {}, 0
    for key in ranks[0]["scenarios"][scenario]["union_batches"][0]:
        points = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, f"batch/{key}"))
        assert [s for s, _ in points] == [e * STEPS + b for e in range(EPOCHS) for b in range(EVERY, STEPS + 1, EVERY)]
        for step, value in points:
            batch = (step - 1) % STEPS  # the batch of its epoch after which it was logged
            counts = tuple(b * (batch + 1) for b in BATCH)
            truth = want(ranks, scenario, key, "batches", counts, batch)
            assert value == pytest.approx(truth, rel=REL, abs=1e-7), (scenario, key, step, value, truth)
            worst[key] = max(worst.get(key, 0.0), abs(value - truth) / max(abs(truth), 1e-12))
            if abs(truth) > 1e-6:  # Keras' own batch logs, before any callback
                keras_ratio[key] = keras_batches[str(batch)][key] / truth
            checked += 1
    if scenario == "classification":  # Keras' own batch logs: the sum over the two workers of the global value
        assert keras_ratio["loss"] == pytest.approx(2.0, rel=1e-5)
        assert keras_ratio["auc"] == pytest.approx(2.0, rel=1e-5)
    assert checked >= EPOCHS * (STEPS // EVERY)
    report(f"tfd_batches_{scenario}", worst_relative_error=worst, keras_over_truth=keras_ratio, values_checked=checked)
