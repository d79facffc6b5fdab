"""What the server could not take survives an AzureML job: the journal defaults to ``./outputs``, which AzureML
uploads into the job's run when the job ends (the node and its disk are gone then), and ``hvd-mlflow sync`` of a
downloaded copy delivers every point once.

2 real Horovod ranks in an AzureML job's environment, the real azureml-mlflow plugin, the offline AzureML front
answering 503 to everything for the whole job (an outage of the workspace's MLflow service). Before the journal moved
there, it was in ``./.hvd_mlflow/journal``, on the node's disk only.
"""

from __future__ import annotations

import shutil
import uuid

import pytest

from tests.support import launch
from tests.support.azureml_front import AzureMLFront
from tests.support.checks import FAST_RETRIES, check_run, report, sync
from tests.support.proxy import Respond

pytestmark = [pytest.mark.multirank, pytest.mark.shared, pytest.mark.azureml, pytest.mark.timeout(600)]
EPOCHS = 3


def test_the_journal_is_kept_with_the_job_and_a_downloaded_copy_syncs_every_point_once(tmp_path, client,
                                                                                       mlflow_server):  # fmt: skip
    front = AzureMLFront(mlflow_server.url, tmp_path / "tls", fault=lambda request: Respond(503))
    with front:
        name = f"azureml-outputs-{uuid.uuid4().hex[:8]}"
        experiment_id = client.create_experiment(name, artifact_location=front.artifact_location(name))
        run_id = client.create_run(experiment_id).info.run_id  # the control plane creates the job's run
        job_env = front.job_environment(run_id, experiment_id)
        job = tmp_path / "job"  # the job's working folder on node 0 (AzureML's code snapshot)
        done = launch.run(job, ["--epochs", str(EPOCHS)], env={**FAST_RETRIES, **job_env,
                                                               "HVD_MLFLOW_FLUSH_TIMEOUT": "8"}).check()  # fmt: skip
        assert client.get_metric_history(run_id, "loss") == []  # the service took nothing during the job
        kept = sorted((job / "outputs" / "hvd_mlflow_journal").glob("*.journal.sqlite"))
        assert len(kept) == 1, sorted(p.relative_to(job) for p in job.rglob("*.journal.sqlite"))  # in ./outputs
        assert "az ml job download" in done.output and "<d>/artifacts/outputs/hvd_mlflow_journal/" in done.output
        # what `az ml job download` brings back (<d>/artifacts/outputs/...), here only the one file the warning names
        # (Studio downloads files one by one): it holds every entry by itself, no -wal beside it
        download = tmp_path / "download" / "artifacts" / kept[0].relative_to(job)
        download.parent.mkdir(parents=True)
        shutil.copyfile(kept[0], download)
        front.fault = None  # the service is back
        # the job's credentials: the only ones the offline front takes (a laptop signs in with az login instead)
        synced = sync(tmp_path / "download", str(download), env=job_env)
        assert synced.returncode == 0 and "Traceback" not in synced.stderr, synced.stdout + synced.stderr
        counts = check_run(client, run_id, [done.rank(0), done.rank(1)], EPOCHS)  # every point once, global values
        assert client.get_run(run_id).info.status == "RUNNING"  # the job's run stays AzureML's
    report("journal in outputs", journal=str(kept[0].relative_to(job)), **counts)


@pytest.mark.alone  # it bounds durations
def test_a_workspace_answering_503_costs_the_job_what_a_refusing_address_costs(tmp_path, client, mlflow_server):
    """The workspace's MLflow front answers 503 to everything for the whole job (the real plugin's path: azureml://,
    where no TCP probe applies), default flush_timeout: known down as fast as an address that refuses. Before, the end
    of fit waited on MLflow's retries of every call, until flush_timeout."""
    from hvd_mlflow.delivery.sender import DOWN_GRACE_S
    from tests.support.mlflow_server import free_port

    seconds, ends = {}, {}
    with AzureMLFront(mlflow_server.url, tmp_path / "tls", fault=lambda request: Respond(503)) as front:
        name = f"azureml-503-{uuid.uuid4().hex[:8]}"
        experiment_id = client.create_experiment(name, artifact_location=front.artifact_location(name))
        for case in ("refused", "503"):
            run_id = client.create_run(experiment_id).info.run_id
            env = {**front.job_environment(run_id, experiment_id), "HVD_MLFLOW_LOG_MODELS": "1"}  # defaults otherwise
            if case == "refused":  # the same job's environment, the workspace's address closed
                env["MLFLOW_TRACKING_URI"] = front.tracking_uri.replace(f":{front.port}/", f":{free_port()}/")
            done = launch.run(tmp_path / case, ["--epochs", "4"], env=env).check()
            seconds[case], ends[case] = round(done.seconds, 1), round(done.rank(0)["end_fit_s"], 2)
            assert "hvd-mlflow sync" in done.output, done.output[-3000:]
        assert front.requests and {r.status for r in front.requests} == {503}
    report("azureml 503 whole job", seconds=seconds, end_fit_s=ends)
    # both ends of fit: the sender's grace once, the plugin's own start beside it (4.2 s in both cases here), never
    # MLflow's retries of each call until flush_timeout (before: an azureml:// URI was never probed, refused or 503)
    assert max(ends.values()) <= DOWN_GRACE_S + 3.0, (ends, seconds)  # 4.1-4.9 s measured; 58 s before
    assert seconds["503"] <= seconds["refused"] + 10.0, (ends, seconds)
