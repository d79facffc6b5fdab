"""Rehearse an AzureML command job before paying for it (scripts/rehearse-azureml-job.sh; Linux, root).

The job's ``command`` runs over ``resources.instance_count`` simulated nodes (network namespaces with their own
hostnames and working directories, tests/support/cluster.py) the way AzureML runs its ``distribution``:

* ``type: mpi``: Open MPI's mpirun on node 0, ``process_count_per_instance`` ranks on each node (Horovod's ranks,
  or keras.distribution's JAX processes, which read Open MPI's variables: examples/azureml/job-jax.yml);
* ``type: tensorflow``: ``worker_count`` plain processes spread evenly over the nodes, each with the ``TF_CONFIG``
  AzureML writes (every worker on its node's address, no chief task: worker 0 is the chief).

The code snapshot (``code:``) is copied to each node's directory, the job's ``environment_variables`` and AzureML's
MLflow variables (tracking URI, token, run id) are set for every process, and the tracking server is on a third
host behind the offline AzureML front, reached through the real azureml-mlflow plugin. Then the job's run is
printed as run-example.sh prints one: status, each curve's points, which ranks ran where, and which hosts talked to
the tracking server.

What it cannot rehearse: Azure itself (the compute cluster, the image build, Studio's rendering, real tokens and
throttling): docs/azureml.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support import tf_workers  # noqa: E402
from tests.support.cluster import Cluster, unavailable  # noqa: E402
from tests.support.environment import clean_environment  # noqa: E402
from tests.support.tracking_host import TrackingHost  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", type=Path, default=REPO / "examples" / "azureml" / "job.yml")
    parser.add_argument("--nodes", type=int, help="default: the job's resources.instance_count")
    parser.add_argument("--ranks-per-node", type=int, help="default: the job's process_count_per_instance")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=VALUE", help="override a job input")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--report", type=Path, metavar="FILE",
                        help="also write the job's run (every point) and the front's requests as JSON")  # fmt: skip
    args = parser.parse_args()
    why = unavailable()
    if why:
        print(f"rehearse-azureml-job: {why}", file=sys.stderr)
        return 2
    spec = yaml.safe_load(args.job.read_text())
    distribution = spec.get("distribution") or {}
    kind = distribution.get("type")
    if kind not in ("mpi", "tensorflow"):
        print(f"rehearse-azureml-job: {args.job}: distribution.type is {kind!r}; this rehearses mpi and tensorflow",
              file=sys.stderr)  # fmt: skip
        return 2
    nodes = args.nodes or int((spec.get("resources") or {}).get("instance_count", 1))
    if kind == "mpi":
        per_node = args.ranks_per_node or int(distribution.get("process_count_per_instance", 1))
    else:
        workers = int(distribution.get("worker_count", nodes))
        per_node = args.ranks_per_node or max(1, workers // nodes)
        if not args.ranks_per_node and workers != per_node * nodes:
            print(f"rehearse-azureml-job: worker_count {workers} does not spread evenly over {nodes} nodes",
                  file=sys.stderr)  # fmt: skip
            return 2
    command = _command(spec, args.input)
    code = (args.job.parent / spec.get("code", ".")).resolve()
    with tempfile.TemporaryDirectory(prefix="rehearse-") as tmp:
        folder = Path(tmp)
        cluster = Cluster(folder, nodes=nodes)
        host = TrackingHost(cluster, folder, "azureml")
        try:
            cluster.up()
            host.start().wait_ready()
            run_id, _, job_environment = host.job_run(spec.get("experiment_name", "rehearsal"))
            for node in cluster.nodes:
                assert node.workdir is not None
                _snapshot(code, node.workdir)
            job_variables = {k: str(v) for k, v in (spec.get("environment_variables") or {}).items()}
            path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"  # the image's python
            variables = {**job_environment, **job_variables, "PATH": path}
            unit = "rank" if kind == "mpi" else "worker"
            print(f"== {nodes} node(s) x {per_node} {unit}(s), {kind}: {command}", flush=True)
            if kind == "mpi":
                returncode = _mpi(cluster, per_node, command, variables, args.timeout)
            else:
                returncode = _tensorflow(cluster, folder, per_node, command, variables, args.timeout)
            _show(host, run_id, cluster, args.report)
            return returncode
        finally:
            host.stop()
            cluster.down()


def _mpi(cluster: Cluster, per_node: int, command: str, variables: dict[str, str], timeout: float) -> int:
    launch = cluster.mpirun(per_node, ["bash", "-c", command], variables, exported=sorted(variables))
    done = subprocess.run([str(cluster.enter), "node0", *launch], env={**clean_environment(), **variables},
                          timeout=timeout)  # fmt: skip
    return done.returncode


def tf_configs(cluster: Cluster, per_node: int, port: int = 23456) -> list[tuple[str, str]]:
    """(node, TF_CONFIG) per worker, as AzureML writes them: workers only, worker w on node w // per_node."""
    nodes = cluster.nodes
    workers = [(nodes[w // per_node], port + w % per_node) for w in range(per_node * len(nodes))]
    spec = {"worker": [f"{node.address}:{p}" for node, p in workers]}
    return [(node.name, tf_workers.tf_config(spec, ("worker", w))) for w, (node, _) in enumerate(workers)]


def _tensorflow(cluster: Cluster, folder: Path, per_node: int, command: str, variables: dict[str, str],
                timeout: float) -> int:  # fmt: skip
    processes = []
    for index, (node, tf_config) in enumerate(tf_configs(cluster, per_node)):
        log = folder / f"worker{index}.log"
        env = {**clean_environment(), **variables, "TF_CONFIG": tf_config}
        processes.append((index, log, cluster.popen(node, ["bash", "-c", command], env, log)))
    deadline = time.monotonic() + timeout
    codes = []
    for index, log, process in processes:
        try:
            codes.append(process.wait(max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            process.kill()
            codes.append(process.wait())
        for line in log.read_text(errors="replace").splitlines():
            print(f"[worker {index}] {line}")
    return next((code for code in codes if code), 0)


def _command(spec: dict, overrides: list[str]) -> str:
    inputs = {name: (value.get("default") if isinstance(value, dict) else value)
              for name, value in (spec.get("inputs") or {}).items()}  # fmt: skip
    for item in overrides:
        name, _, value = item.partition("=")
        inputs[name] = value
    return re.sub(r"\$\{\{\s*inputs\.(\w+)\s*\}\}", lambda m: str(inputs[m.group(1)]), spec["command"])


def _snapshot(code: Path, workdir: Path) -> None:
    """The job's code as AzureML uploads it: the files git tracks (or the folder without environments)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=code,
                            capture_output=True, text=True)  # fmt: skip
    if listed.returncode == 0 and listed.stdout:
        for name in listed.stdout.splitlines():
            source = code / name
            if source.is_file():
                (workdir / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, workdir / name)
    else:
        shutil.copytree(code, workdir, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".venv*", ".git", "mlruns"))


def _show(host: TrackingHost, run_id: str, cluster: Cluster, report: Path | None = None) -> None:
    store = host.store()
    run = store.get_run(run_id)
    print(f"\nthe job's run {run_id} ({run.info.status}) on the offline AzureML front")
    for key in sorted(run.data.metrics):
        points = store.get_metric_history(run_id, key)
        print(f"  {key:<28} {len(points)} points, last {points[-1].value:.4f}")
    print(f"  ranks ran on: {run.data.tags.get('hvd_mlflow.hosts', '?')}")
    shape = ("world_size", "batch_size", "global_batch_size", "steps_per_epoch")
    print("  params: " + ", ".join(f"{k}={run.data.params.get(k, '-')}" for k in shape))
    by_address = {h.address: h.name for h in cluster.hosts.values()}
    seen = host.seen()
    talked = sorted({by_address.get(a, a) for a in seen["connections"]})
    print(f"  hosts that connected to the tracking server: {', '.join(talked) or 'none'}")
    by_host: dict[str, int] = {}
    for request in seen["requests"]:
        name = by_address.get(request["client"], request["client"])
        by_host[name] = by_host.get(name, 0) + 1
    print("  requests by host: " + (", ".join(f"{name} {n}" for name, n in sorted(by_host.items())) or "none"))
    if report is not None:
        metrics = {key: [[m.step, m.value] for m in sorted(store.get_metric_history(run_id, key), key=lambda m: m.step)]
                   for key in run.data.metrics}  # fmt: skip
        hosts = {name: by_address.get(name, name) for name in {r["client"] for r in seen["requests"]}}
        requests = [{**r, "host": hosts[r["client"]]} for r in seen["requests"]]
        connections = [by_address.get(a, a) for a in seen["connections"]]
        report.write_text(json.dumps({"run_id": run_id, "status": run.info.status, "metrics": metrics,
                                      "params": run.data.params, "tags": run.data.tags, "requests": requests,
                                      "connections": connections}, indent=1))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
