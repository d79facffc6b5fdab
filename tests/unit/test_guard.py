"""The guard on a rank other than 0: every MLflow write path is a no-op; hvd-mlflow's own sender passes."""

from __future__ import annotations

import mlflow
import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.tracking import fluent

from hvd_mlflow.common import compat
from hvd_mlflow.common.topology import Topology
from hvd_mlflow.delivery import mlflow_calls as guard


def test_every_write_path_is_a_no_op_on_rank_1_and_the_rank_is_asked_at_each_call(tmp_path, monkeypatch):
    from mlflow import log_metric as imported_before  # as a script that imports it before autolog()

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    rank = {"now": 1}
    monkeypatch.setattr(guard.topology, "current", lambda: Topology(rank["now"], 2, rank["now"], "test"))
    guard.install(1, "the-job-run", job_mode=False)
    try:
        imported_before("stray", 1.0)
        mlflow.log_params({"stray": 1})
        # a run object, nothing created; not the job's run: create_run makes a new run on rank 0
        assert MlflowClient().create_run("0").info.run_id == "hvd-mlflow:rank-1:unknown-run-id"
        MlflowClient().log_metric("the-job-run", "stray", 1.0)
        with mlflow.start_run() as run:
            assert run.info.run_id == mlflow.active_run().info.run_id == "the-job-run"
        assert mlflow.active_run() is None
        assert "stray" not in guard.user_metric_names("the-job-run")  # the budget never counts rank 1's tries
        with guard.internal():  # hvd-mlflow's own sender, in a process that stopped being rank 0 mid-request
            internal_experiment = MlflowClient().create_experiment("written-by-the-sender")
        rank["now"] = 0  # an elastic reset made this process rank 0: its writes go through again
        MlflowClient().create_experiment("written-as-rank-0")
    finally:
        guard.uninstall()
        mlflow.set_tracking_uri(None)
    client = MlflowClient(uri)
    names = sorted(e.name for e in client.search_experiments())
    assert names == ["Default", "written-as-rank-0", "written-by-the-sender"], names
    assert client.search_runs(["0", internal_experiment]) == []  # no stray run, no stray point


def test_other_ranks_get_what_mlflow_promises_without_writing(tmp_path, monkeypatch):
    import mlflow.pyfunc
    from mlflow.entities import Experiment, Run
    from mlflow.entities.model_registry import ModelVersion, RegisteredModel
    from mlflow.models.model import ModelInfo

    mlflow3 = compat.mlflow3()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    for variable in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(guard.topology, "current", lambda: Topology(1, 2, 1, "test"))
    guard.install(1, None, job_mode=False)
    try:
        experiment = mlflow.set_experiment("x")
        assert isinstance(experiment, Experiment) and experiment.name == "x"
        assert experiment.experiment_id == "hvd-mlflow:rank-1:unknown-experiment-id"
        monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", "17")  # the job's experiment, by id and name
        monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "y")
        assert mlflow.set_experiment("y").experiment_id == "17"
        assert mlflow.set_experiment(experiment_id="5").experiment_id == "5"
        with mlflow.start_run(run_name="r") as run:
            assert (run.info.experiment_id, run.info.run_name, run.info.status) == ("5", "r", "RUNNING")
            assert mlflow.log_param("k", 3) == 3
            # nothing is saved: any object will do; MLflow 3 names the model `name`, 2.x `artifact_path`
            info = mlflow.pyfunc.log_model(**{"name" if mlflow3 else "artifact_path": "net"}, python_model=object())
        assert isinstance(info, ModelInfo) and info.artifact_path == "net" and "python_function" in info.flavors
        if mlflow3:  # a logged model
            assert info.model_uri == "models:/hvd-mlflow:rank-1:unknown-model-id" == f"models:/{info.model_id}"
        else:
            assert info.model_uri == f"runs:/{run.info.run_id}/net"
        assert info.run_id == run.info.run_id
        client = MlflowClient()
        assert isinstance(mlflow.create_experiment("z"), str) and isinstance(client.create_experiment("z"), str)
        assert isinstance(client.create_run("5"), Run) and client.log_param("run", "k", "v") == "v"
        if mlflow3:  # MLflow 2.x has no logged models
            from mlflow.entities import LoggedModel

            model = client.create_logged_model("5", name="m", params={"a": 1})
            assert isinstance(model, LoggedModel) and model.params == {"a": "1"} and model.name == "m"
        assert isinstance(client.create_registered_model("reg"), RegisteredModel)
        version = client.create_model_version("reg", "models:/m-1", run_id="run")
        assert isinstance(version, ModelVersion) and (version.name, version.run_id) == ("reg", "run")
        assert mlflow.log_metric("m", 1.0) is None
    finally:
        guard.uninstall()
        mlflow.set_tracking_uri(None)
    client = MlflowClient(uri)
    assert [e.name for e in client.search_experiments()] == ["Default"]
    assert client.search_runs(["0"]) == [] and client.search_registered_models() == []


# What other ranks return where rank 0's answer comes from the server: a value naming hvd-mlflow and the rank
# that MLflow never produces (its ids are hex or integers) and that MLflow refuses (a ':' is outside its id pattern).
UNKNOWN = {kind: f"hvd-mlflow:rank-1:unknown-{kind}" for kind in ("experiment-id", "run-id", "model-id",
                                                                   "model-version")}  # fmt: skip


@pytest.fixture
def rank_1(tmp_path, monkeypatch):
    """This process as rank 1 of 2 (the launcher's variables, as horovodrun sets them), a store holding the
    Default experiment with one run in it, and no experiment or run named by the environment."""
    for variable in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "AZUREML_RUN_ID"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "1")
    monkeypatch.setattr(fluent, "_active_experiment_id", None)  # no set_experiment of an earlier test
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = MlflowClient(uri)
    default_run = store.create_run("0").info.run_id  # what a stand-in id of "0" or "" would read
    mlflow.set_tracking_uri(uri)
    yield store, default_run
    guard.uninstall()
    mlflow.set_tracking_uri(None)


def test_ids_only_rank_0_can_know_are_unmistakable_and_refused_loudly(rank_1):
    import mlflow.pyfunc

    store, default_run = rank_1
    guard.install(1, None, job_mode=False)
    client = MlflowClient()
    experiment = mlflow.set_experiment("x")
    assert experiment.experiment_id == UNKNOWN["experiment-id"]
    assert client.create_experiment("z") == mlflow.create_experiment("z2") == UNKNOWN["experiment-id"]
    with mlflow.start_run() as run:  # rank 0 creates a run: its id comes from the server
        assert (run.info.run_id, run.info.experiment_id) == (UNKNOWN["run-id"], UNKNOWN["experiment-id"])
        info = mlflow.pyfunc.log_model(**{"name" if compat.mlflow3() else "artifact_path": "net"},
                                       python_model=object())  # fmt: skip
    assert info.run_id == UNKNOWN["run-id"]
    if compat.mlflow3():
        assert (info.model_id, info.model_uri) == (UNKNOWN["model-id"], f"models:/{UNKNOWN['model-id']}")
    created = client.create_run("5", run_name="more")  # a new run on rank 0, in the experiment asked for
    assert (created.info.run_id, created.info.experiment_id) == (UNKNOWN["run-id"], "5")
    version = client.create_model_version("reg", "models:/m-1")
    assert (version.version, client.update_model_version("reg", "3", "d").version) == (UNKNOWN["model-version"], "3")
    # What a script then reads on this rank fails at once, loudly, instead of reading the Default experiment's run
    # (MLflow itself: an error, an empty list on 2.12, 4 minutes of retries of a 3.15 server's 500)
    for read in (lambda: mlflow.search_runs([experiment.experiment_id]), lambda: client.get_run(run.info.run_id),
                 lambda: client.get_experiment(experiment.experiment_id), lambda: mlflow.get_run(created.info.run_id),
                 lambda: client.search_runs(["0"], f"attributes.run_id = '{run.info.run_id}'"),
                 lambda: client.get_metric_history(run.info.run_id, "loss")):  # fmt: skip
        with pytest.raises(MlflowException, match="hvd-mlflow:rank-1:unknown-.*only rank 0 has"):
            read()
    assert client.get_run(default_run).info.run_id == default_run  # real ids read as before
    assert [r.info.run_id for r in store.search_runs(["0"])] == [default_run]  # nothing was written


def test_ids_this_rank_knows_are_the_real_ones(rank_1, monkeypatch):
    store, default_run = rank_1
    guard.install(1, "the-job-run", job_mode=False)  # MLFLOW_RUN_ID as autolog() found it
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", "7")  # the job's experiment: by id alone
    with mlflow.start_run() as run:  # rank 0 attaches to the job's run, which is in the job's experiment
        assert (run.info.run_id, run.info.experiment_id) == ("the-job-run", "7")
    with mlflow.start_run(run_id=default_run) as run:  # an id the user passed
        assert run.info.run_id == default_run
    # a name the environment does not give: its id is the server's (rank 0 may create the experiment)
    assert mlflow.set_experiment("x").experiment_id == UNKNOWN["experiment-id"]
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "the-job")  # the job's experiment by id and name
    assert mlflow.set_experiment("the-job").experiment_id == "7"
    assert mlflow.set_experiment(experiment_id="5").experiment_id == "5"  # an id the user passed
    assert mlflow.set_experiment(experiment_id="7").name == "the-job"
    assert mlflow.set_experiment(experiment_id="5").name == "hvd-mlflow:rank-1:unknown-experiment-name"
    assert MlflowClient().create_run("5").info.experiment_id == "5"


def test_in_an_azureml_job_the_job_run_is_azureml_run_id_on_every_rank(rank_1, monkeypatch):
    """MLFLOW_RUN_ID gone before autolog() (a start_run() before it deletes it): the job's run is still
    AZUREML_RUN_ID, on rank 1 and on rank 0, which attaches to it at every start_run."""
    store, default_run = rank_1
    monkeypatch.setenv("AZUREML_RUN_ID", default_run)
    guard.install(1, None, job_mode=True)
    with mlflow.start_run() as run:
        assert run.info.run_id == default_run
    guard.uninstall()
    monkeypatch.setenv("HOROVOD_RANK", "0")
    guard.install(0, None, job_mode=True)
    for _ in range(2):  # MLflow's end_run() unsets MLFLOW_RUN_ID: the second start_run finds the job's run too
        with mlflow.start_run() as run:
            assert run.info.run_id == default_run
    mlflow.log_metric("after", 1.0)  # no active run: MLflow starts one, the job's
    mlflow.end_run()
    assert [r.info.run_id for r in store.search_runs(["0"])] == [default_run]
    assert [m.value for m in store.get_metric_history(default_run, "after")] == [1.0]
    guard.uninstall()
    monkeypatch.setenv("HOROVOD_RANK", "1")
    guard.install(1, None, job_mode=False)  # outside a job AZUREML_RUN_ID names no run of this tracking server
    with mlflow.start_run() as run:
        assert run.info.run_id == UNKNOWN["run-id"]


def test_the_rank_in_the_unknown_ids_is_the_rank_now(rank_1, monkeypatch):
    guard.install(1, None, job_mode=False)
    monkeypatch.setenv("HOROVOD_RANK", "3")
    monkeypatch.setenv("HOROVOD_SIZE", "4")
    assert mlflow.set_experiment("x").experiment_id == "hvd-mlflow:rank-3:unknown-experiment-id"
    assert MlflowClient().create_run("1").info.run_id == "hvd-mlflow:rank-3:unknown-run-id"


def test_register_model_writes_nothing_on_rank_1(rank_1, tmp_path):
    """``mlflow.register_model`` makes its version through ``MlflowClient._create_model_version``: guarded too."""
    store, _ = rank_1
    guard.install(1, None, job_mode=False)
    version = mlflow.register_model(str(tmp_path / "saved-model"), "reg")
    assert (version.name, version.version) == ("reg", UNKNOWN["model-version"])
    assert store.search_registered_models() == [] and store.search_model_versions("name = 'reg'") == []


@pytest.mark.parametrize(
    ("turned_off_by", "lands"),
    [("argument", True), ("environment", True), ("default", False)],
)
def test_guard_other_ranks_off_lets_rank_1_write_and_mlflow_keras_autologging_stays_off(
    rank_1, monkeypatch, turned_off_by, lands
):
    """reference.md's `guard_other_ranks` row and azureml.md's list: `autolog(guard_other_ranks=False)` or
    HVD_MLFLOW_GUARD_OTHER_RANKS=0 lets rank 1's own `mlflow.log_metric` reach the store (the default guard keeps it
    out), and MLflow's TensorFlow/Keras autologging is turned off on that rank either way."""
    import mlflow.tensorflow
    from mlflow.utils.autologging_utils import autologging_is_disabled

    import hvd_mlflow

    store, default_run = rank_1
    if turned_off_by == "environment":
        monkeypatch.setenv("HVD_MLFLOW_GUARD_OTHER_RANKS", "0")
    hvd_mlflow.autolog(**({"guard_other_ranks": False} if turned_off_by == "argument" else {}))
    try:
        with mlflow.start_run(run_id=default_run):
            mlflow.log_metric("from_rank_1", 2.5, step=3)
        mlflow.tensorflow.autolog()  # what a user's script asks for on every rank
        assert autologging_is_disabled(mlflow.tensorflow.FLAVOR_NAME)  # MLflow's own record of the integration
    finally:
        hvd_mlflow.autolog(disable=True)
    history = [(m.value, m.step) for m in store.get_metric_history(default_run, "from_rank_1")]
    assert history == ([(2.5, 3)] if lands else [])
