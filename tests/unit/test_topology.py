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


def test_an_mpi_built_horovod_in_a_world_of_one_was_asked_for_it():
    topology.check_horovod_world(1, {"OMPI_COMM_WORLD_SIZE": "4"}, mpi_built=True)  # hvd.init(comm=[rank])


def test_hosts_are_described_by_rank_ranges_in_order_of_first_rank():
    assert topology.describe_hosts(["node0", "node0", "node1", "node1"]) == "node0:0-1 node1:2-3"
    assert topology.describe_hosts(["b", "a", "b", "b", "a", "c"]) == "b:0,2-3 a:1,4 c:5"
    assert topology.describe_hosts(["solo"]) == "solo:0"
