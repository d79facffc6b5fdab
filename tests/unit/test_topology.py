from __future__ import annotations

import json

import pytest

from hvd_mlflow.topology import from_environment


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
