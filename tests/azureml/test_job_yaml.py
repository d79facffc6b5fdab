"""The AzureML example's YAML files load with azure-ai-ml's own loaders (offline): a schema error fails here."""

from __future__ import annotations

from pathlib import Path

from azure.ai.ml import MpiDistribution, load_environment, load_job
from azure.ai.ml.entities import Command, CommandJob

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "azureml"


def test_job_yaml_is_a_two_node_mpi_command_job():
    job = load_job(EXAMPLE / "job.yml")
    assert isinstance(job, CommandJob | Command)
    assert isinstance(job.distribution, MpiDistribution)
    assert job.distribution.process_count_per_instance == 1
    assert job.resources.instance_count == 2
    assert job.environment_variables["TF_USE_LEGACY_KERAS"] == "1"
    assert "examples/train_cnn.py" in job.command
    assert (EXAMPLE / job.code).resolve() == EXAMPLE.parents[1]


def test_environment_yaml_builds_from_the_docker_context():
    environment = load_environment(EXAMPLE / "environment.yml")
    assert environment.build is not None
    context = EXAMPLE / "environment"
    assert (context / "Dockerfile").is_file()
    dockerfile = (context / "Dockerfile").read_text()
    assert "TF_USE_LEGACY_KERAS=1" in dockerfile and "HOROVOD_WITH_MPI=1" in dockerfile
    # the image pins what the tests run with
    repo_pins = (EXAMPLE.parents[1] / "requirements" / "tf2.16.txt").read_text()
    assert (context / "constraints.txt").read_text() == repo_pins
