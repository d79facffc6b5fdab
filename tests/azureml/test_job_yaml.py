"""The AzureML example's YAML files load with azure-ai-ml's own loaders (offline): a schema error fails here."""

from __future__ import annotations

from pathlib import Path

from azure.ai.ml import MpiDistribution, TensorFlowDistribution, load_environment, load_job
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


def test_the_tf_distribute_job_is_two_nodes_one_worker_each_in_an_image_without_horovod():
    job = load_job(EXAMPLE / "job-tfdistribute.yml")
    assert isinstance(job, CommandJob | Command)
    assert isinstance(job.distribution, TensorFlowDistribution)
    assert job.distribution.worker_count == 2 and job.resources.instance_count == 2  # one worker per node
    assert job.environment_variables["TF_USE_LEGACY_KERAS"] == "1"  # Keras 3 cannot train with the strategy
    assert "examples/train_cnn_tfdistribute.py" in job.command
    assert (EXAMPLE / job.code).resolve() == EXAMPLE.parents[1]
    environment = load_environment(EXAMPLE / "environment-tfdistribute.yml")
    assert job.environment.removeprefix("azureml:") == f"{environment.name}:{environment.version}"
    context = EXAMPLE / "environment-tfdistribute"
    dockerfile = (context / "Dockerfile").read_text()
    commands = [line for line in dockerfile.lower().splitlines() if line.strip() and not line.startswith("#")]
    assert commands and not any("horovod" in line for line in commands)  # nothing of Horovod is installed
    repo_pins = (EXAMPLE.parents[1] / "requirements" / "tfdistribute.txt").read_text()
    assert (context / "constraints.txt").read_text() == repo_pins
    pins = dict(line.split("==") for line in (context / "constraints.txt").read_text().splitlines() if "==" in line)
    for package in ("tensorflow-cpu", "tf-keras", "mlflow-skinny", "azureml-mlflow"):
        assert f"{package}=={pins[package]}" in dockerfile, package


def test_the_jax_job_is_two_nodes_under_mpirun_in_an_image_of_keras_3_on_jax_without_tensorflow():
    job = load_job(EXAMPLE / "job-jax.yml")
    assert isinstance(job, CommandJob | Command)
    assert isinstance(job.distribution, MpiDistribution)  # mpirun: keras.distribution.initialize() reads Open MPI's
    assert job.distribution.process_count_per_instance == 1 and job.resources.instance_count == 2
    assert job.environment_variables["KERAS_BACKEND"] == "jax"  # what scripts/rehearse-azureml-job.sh reads too
    assert "examples/train_cnn_jax.py" in job.command
    assert (EXAMPLE / job.code).resolve() == EXAMPLE.parents[1]
    environment = load_environment(EXAMPLE / "environment-jax.yml")
    assert job.environment.removeprefix("azureml:") == f"{environment.name}:{environment.version}"
    context = EXAMPLE / "environment-jax"
    dockerfile = (context / "Dockerfile").read_text()
    commands = [line for line in dockerfile.lower().splitlines() if line.strip() and not line.startswith("#")]
    assert commands and not any("tensorflow" in line or "horovod" in line for line in commands)
    assert "KERAS_BACKEND=jax" in dockerfile
    repo_pins = (EXAMPLE.parents[1] / "requirements" / "jax.txt").read_text()
    assert (context / "constraints.txt").read_text() == repo_pins
    pins = dict(line.split("==") for line in repo_pins.splitlines() if "==" in line)
    for package in ("jax", "keras", "mlflow-skinny", "azureml-mlflow"):
        assert f"{package}=={pins[package]}" in dockerfile.replace("jax[cpu]", "jax"), package
