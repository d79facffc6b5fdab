from __future__ import annotations

import json

import pytest

from hvd_mlflow import LauncherMismatchError
from hvd_mlflow.common import topology
from hvd_mlflow.common.topology import from_environment


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, (0, 1, 0, "single-process")),
        (
            {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
            (3, 8, 1, "open-mpi"),
        ),
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, (1, 2, 1, "pmi")),
        ({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, (2, 4, 0, "torch-style")),
        (
            {
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": {"chief": ["a"], "worker": ["b", "c"]},
                        "task": {"type": "worker", "index": 1},
                    }
                )
            },
            (2, 3, 0, "tf-config"),
        ),
    ],
)
def test_topology_from_launcher_environment(environ, expected):
    t = from_environment(environ)
    assert (t.rank, t.size, t.local_rank, t.source) == expected


@pytest.mark.parametrize("variable", ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
def test_a_launcher_world_larger_than_horovods_one_is_refused(variable):
    with pytest.raises(LauncherMismatchError, match="built without MPI.*horovodrun --gloo"):
        topology.check_horovod_world(1, {variable: "2"})


@pytest.mark.parametrize(
    "size, environ",
    [
        (4, {"OMPI_COMM_WORLD_SIZE": "4"}),  # Horovod with MPI under mpirun: the same world
        (1, {"OMPI_COMM_WORLD_SIZE": "1"}),  # mpirun -np 1
        (1, {}),  # one process, no launcher
        (1, {"HOROVOD_SIZE": "2"}),  # horovodrun's (elastic) variables are not a fixed world
    ],
)
def test_worlds_that_agree_pass(size, environ):
    topology.check_horovod_world(size, environ)


@pytest.mark.parametrize("variable", ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
def test_an_mpi_built_horovod_that_sees_a_world_of_one_under_a_launcher_of_several_is_refused(variable):
    """An Open MPI build under MPICH's or Intel's mpiexec (PMI_SIZE=2) initialises each process alone: two writers,
    each 'rank 0 of 1' (seen). Refused on every process alike, unless a world of one was asked for."""
    with pytest.raises(LauncherMismatchError, match="not with the launcher's MPI.*allow_world_of_one"):
        topology.check_horovod_world(1, {variable: "2"}, mpi_built=True)
    topology.check_horovod_world(1, {variable: "4"}, mpi_built=True, allowed=True)  # hvd.init(comm=[rank])


def test_tf_config_naming_several_workers_for_a_model_that_trains_alone_is_refused():
    two = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})}
    with pytest.raises(LauncherMismatchError, match=r"TF_CONFIG names 2 workers.*_DefaultDistributionStrategy.*scope"):
        topology.check_tf_config_world(1, "_DefaultDistributionStrategy", two)
    topology.check_tf_config_world(2, "MultiWorkerMirroredStrategy", two)  # the strategy spans them
    topology.check_tf_config_world(1, "_DefaultDistributionStrategy", two, allowed=True)
    one = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})}
    topology.check_tf_config_world(1, "_DefaultDistributionStrategy", one)
    ps = {"TF_CONFIG": json.dumps({"cluster": {"chief": ["c:0"], "worker": ["a:1", "b:2"], "ps": ["p:3"]},
                                   "task": {"type": "chief", "index": 0}})}  # fmt: skip
    topology.check_tf_config_world(1, "ParameterServerStrategyV2", ps)  # only the coordinator runs fit


def test_tf_config_ranks_tasks_as_tf_distribute_does_the_chief_first():
    cluster = {"chief": ["c:0"], "worker": ["a:1", "b:2"], "evaluator": ["e:3"]}
    ranks = {(t, i): topology.rank_in_cluster(cluster, t, i) for t, i in [("chief", 0), ("worker", 0), ("worker", 1),
                                                                          ("evaluator", 0)]}  # fmt: skip
    assert ranks == {("chief", 0): 0, ("worker", 0): 1, ("worker", 1): 2, ("evaluator", 0): 3}
    assert topology.rank_in_cluster({"worker": ["a", "b"]}, "worker", 0) == 0  # no chief: worker 0 is rank 0


def test_hosts_are_described_by_rank_ranges_in_order_of_first_rank():
    assert topology.describe_hosts(["node0", "node0", "node1", "node1"]) == "node0:0-1 node1:2-3"
    assert topology.describe_hosts(["b", "a", "b", "b", "a", "c"]) == "b:0,2-3 a:1,4 c:5"
    assert topology.describe_hosts(["solo"]) == "solo:0"


@pytest.mark.parametrize("variable", ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "KERAS_DISTRIBUTION_NUM_PROCESSES"])
def test_a_launcher_world_that_no_engine_joins_is_refused(variable):
    """mpirun (or KERAS_DISTRIBUTION_*) started two processes, but neither Horovod, a multi-worker strategy nor JAX's
    runtime joins them: each would log as rank 0. Refused alike, naming the engine to start for the model's backend."""
    with pytest.raises(LauncherMismatchError, match=r"started 2 processes.*keras.distribution.initialize\(\)"):
        topology.check_launcher_world(1, "jax", {variable: "2"})
    with pytest.raises(LauncherMismatchError, match=r"started 2 processes.*hvd.init\(\)"):
        topology.check_launcher_world(1, "tensorflow", {variable: "2"})
    topology.check_launcher_world(2, "jax", {variable: "2"})  # the engine spans them
    topology.check_launcher_world(1, "jax", {variable: "2"}, allowed=True)
    topology.check_launcher_world(1, "jax", {variable: "1"})
    topology.check_launcher_world(1, "jax", {})


def test_keras_distribution_variables_give_the_rank():
    found = topology.from_environment({"KERAS_DISTRIBUTION_PROCESS_ID": "1", "KERAS_DISTRIBUTION_NUM_PROCESSES": "2"})
    assert (found.rank, found.size, found.local_rank, found.source) == (1, 2, 0, "keras.distribution")
