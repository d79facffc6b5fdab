"""Rehearse an AzureML command job before paying for it (scripts/rehearse-azureml-job.sh; Linux, root).

The job's ``command`` runs the way AzureML's ``distribution: type: mpi`` runs it: Open MPI's mpirun on node 0 over
``resources.instance_count`` simulated nodes (network namespaces with their own hostnames and working directories,
tests/support/cluster.py), ``process_count_per_instance`` ranks each, the code snapshot (``code:``) copied to each
node's directory, the job's ``environment_variables`` and AzureML's MLflow variables (tracking URI, token, run id)
set for every rank, and the tracking server on a third host behind the offline AzureML front, reached through the
real azureml-mlflow plugin. Then the job's run is printed as run-example.sh prints one: status, each curve's
points, which ranks ran where, and which hosts talked to the tracking server.

What it cannot rehearse: Azure itself (the compute cluster, the image build, Studio's rendering, real tokens and
throttling): docs/azureml.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

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
    args = parser.parse_args()
    why = unavailable()
    if why:
        print(f"rehearse-azureml-job: {why}", file=sys.stderr)
        return 2
    spec = yaml.safe_load(args.job.read_text())
    distribution = spec.get("distribution") or {}
    if distribution.get("type") != "mpi":
        print(f"rehearse-azureml-job: {args.job} is not an MPI job (distribution.type: mpi)", file=sys.stderr)
        return 2
    nodes = args.nodes or int((spec.get("resources") or {}).get("instance_count", 1))
    per_node = args.ranks_per_node or int(distribution.get("process_count_per_instance", 1))
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
            print(f"== {nodes} node(s) x {per_node} rank(s): {command}", flush=True)
            launch = cluster.mpirun(per_node, ["bash", "-c", command], variables, exported=sorted(variables))
            done = subprocess.run([str(cluster.enter), "node0", *launch], env={**clean_environment(), **variables},
                                  timeout=args.timeout)  # fmt: skip
            _show(host, run_id, cluster)
            return done.returncode
        finally:
            host.stop()
            cluster.down()


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


def _show(host: TrackingHost, run_id: str, cluster: Cluster) -> None:
    store = host.store()
    run = store.get_run(run_id)
    print(f"\nthe job's run {run_id} ({run.info.status}) on the offline AzureML front")
    for key in sorted(run.data.metrics):
        points = store.get_metric_history(run_id, key)
        print(f"  {key:<28} {len(points)} points, last {points[-1].value:.4f}")
    print(f"  ranks ran on: {run.data.tags.get('hvd_mlflow.hosts', '?')}")
    by_address = {h.address: h.name for h in cluster.hosts.values()}
    talked = sorted({by_address.get(a, a) for a in host.seen()["connections"]})
    print(f"  hosts that connected to the tracking server: {', '.join(talked) or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
