"""Several hosts on this machine, launched as AzureML launches a multi-node job: Open MPI's ``mpirun`` on node 0.

Each host is a network namespace with its own hostname, ``/etc/hosts`` and (for the nodes) its own working
directory bind-mounted over one job path, as AzureML copies the code snapshot to each node's own disk. The hosts
sit on one bridge (in a namespace of its own) with addresses from one /24 of 10.x on those links only: no route
out, nothing else addressed. Neighbours are permanent, so a host whose link is down is silent (requests hang, as a
host gone from a network does) rather than unreachable at once.

``mpirun`` starts the other node's daemon through :attr:`Cluster.agent` instead of ssh (``--mca plm_rsh_agent``),
with a clean environment as ssh gives: only what ``mpirun -x`` exports reaches that node's ranks, as on AzureML,
where every node gets the job's variables.

Everything a cluster made (namespaces, their processes, Open MPI's daemons in them) is removed by :meth:`down`,
also after a failure or a time-out. Needs root and ``ip netns``: :func:`unavailable` says why not.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.77.21"  # one /24 of 10.x, on links inside the namespaces a cluster makes, nowhere else
MPI_NET = f"{SUBNET}.0/24"
REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PORT = 5000  # the tracking host's front


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    namespace: str
    workdir: Path | None  # bind-mounted over the job path on this host (nodes only)


def unavailable() -> str:
    """Why a cluster cannot be made here ('' when it can)."""
    if os.geteuid() != 0:
        return "multi-node tests need root (network namespaces, bind mounts)"
    for tool in ("ip", "unshare", "mpirun"):
        if shutil.which(tool) is None:
            return f"multi-node tests need {tool} (iproute2, util-linux, openmpi-bin)"
    probe = f"hmprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if made.returncode != 0:
        return f"ip netns add fails here: {made.stderr.strip()}"
    return ""


def require() -> None:
    """In a test: skip where a cluster cannot be made, but fail in CI (root with ip netns: a skip would hide it)."""
    import pytest

    why = unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the multi-node suite cannot run in CI: {why}")
        pytest.skip(why)


class Cluster:
    """Nodes ``node0``, ``node1``, ... and a tracking host ``trk`` on one bridge."""

    def __init__(self, folder: Path, nodes: int = 2, job_path: Path | None = None) -> None:
        self.folder = folder
        self.job_path = job_path or folder / "job"  # the same path on every node, each node's own directory
        tag = f"hm{os.getpid() % 100000}"
        self.bridge = f"{tag}br"
        names = [f"node{i}" for i in range(nodes)] + ["trk"]
        self.hosts = {
            name: Host(name, f"{SUBNET}.{10 + i}", f"{tag}{name}", folder / name if name != "trk" else None)
            for i, name in enumerate(names)
        }
        self.enter = folder / "enter"
        self.agent = folder / "rsh-agent"
        self._made: list[str] = []

    @property
    def nodes(self) -> list[Host]:
        return [h for h in self.hosts.values() if h.workdir is not None]

    # -- life cycle ------------------------------------------------------------------------------------
    def up(self) -> Cluster:
        try:
            self._make()
        except BaseException:
            self.down()
            raise
        return self

    def _make(self) -> None:
        sweep_stale()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.job_path.mkdir(parents=True, exist_ok=True)
        for namespace in [self.bridge, *(h.namespace for h in self.hosts.values())]:
            _ip("netns", "add", namespace)
            self._made.append(namespace)
            _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge, "link", "set", "br0", "up")
        for host in self.hosts.values():
            port = self._port(host)
            _ip("-n", self.bridge, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
            _ip("-n", self.bridge, "link", "set", port, "master", "br0", "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.namespace, "link", "set", "eth0", "up")
            if host.workdir is not None:
                host.workdir.mkdir(parents=True, exist_ok=True)
        macs = {h.name: self._mac(h) for h in self.hosts.values()}
        for host in self.hosts.values():
            for other in self.hosts.values():
                if other is not host:
                    _ip("-n", host.namespace, "neigh", "replace", other.address, "lladdr", macs[other.name],
                        "dev", "eth0", "nud", "permanent")  # fmt: skip
        hosts_file = self.folder / "hosts"
        hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts.values()))
        self._write_scripts(hosts_file)

    def _write_scripts(self, hosts_file: Path) -> None:
        q = shlex.quote
        cases = "".join(
            f"  {h.name}) ns={q(h.namespace)}; dir={q(str(h.workdir or ''))} ;;\n" for h in self.hosts.values()
        )
        self.enter.write_text(  # every path reaches the inner shell as an argument, never inside its code
            "#!/bin/bash\n"
            "# enter HOST COMMAND...: COMMAND on HOST (its network, hostname, /etc/hosts and working directory)\n"
            'host=$1; shift\ncase "$host" in\n' + cases + '  *) echo "enter: no host $host" >&2; exit 2 ;;\nesac\n'
            'exec ip netns exec "$ns" unshare --uts --mount bash -c \'hostname "$0"; mount --bind "$1" /etc/hosts; '
            'if [ -n "$2" ]; then mount --bind "$2" "$3"; cd "$3"; fi; shift 3; exec "$@"\' '
            f'"$host" {q(str(hosts_file))} "$dir" {q(str(self.job_path))} "$@"\n'
        )
        self.agent.write_text(
            "#!/bin/bash\n"
            "# Open MPI's plm_rsh_agent: AGENT [ssh options] HOST COMMAND... enters HOST instead of ssh, with\n"
            "# the clean environment ssh gives: only what mpirun -x exports reaches the ranks there\n"
            "while [[ $# -gt 0 && $1 == -* ]]; do shift; done\nhost=$1; shift\n"
            f'exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="$HOME" '
            f'{shlex.quote(str(self.enter))} "$host" bash -c "$*"\n'
        )
        self.enter.chmod(0o755)
        self.agent.chmod(0o755)

    def down(self) -> None:
        """Kill every process on every host, then delete every namespace made (idempotent)."""
        for _ in range(3):
            pids = [pid for namespace in self._made for pid in _pids(namespace)]
            if not pids:
                break
            for pid in pids:
                _kill(pid, signal.SIGKILL)
            time.sleep(0.3)
        for namespace in reversed(self._made):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        self._made.clear()
        subprocess.run(["umount", str(self.job_path)], capture_output=True)  # never mounted out here; harmless

    def __enter__(self) -> Cluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- acting on hosts ---------------------------------------------------------------------------------
    def popen(self, host: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path = REPO) -> subprocess.Popen:
        with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
            return subprocess.Popen([str(self.enter), host, *argv], env=env, cwd=cwd, stdout=out,
                                    stderr=subprocess.STDOUT)  # fmt: skip

    def run(self, host: str, argv: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.enter), host, *argv], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip

    def link(self, host: str, up: bool) -> None:
        """Plug ``host``'s cable in or out (at the bridge: the host stays up, the network stops reaching it)."""
        _ip("-n", self.bridge, "link", "set", self._port(self.hosts[host]), "up" if up else "down")

    def kill(self, host: str) -> list[int]:
        """SIGKILL every process on ``host`` (a node that dies); the killed pids."""
        pids = _pids(self.hosts[host].namespace)
        for pid in pids:
            _kill(pid, signal.SIGKILL)
        return pids

    def mpirun(self, ranks_per_node: int, argv: list[str], env: dict[str, str], exported: list[str]) -> list[str]:
        """The command that starts ``argv`` on every node with Open MPI, run on node 0 (:meth:`popen` it there)."""
        spec = ",".join(f"{h.name}:{ranks_per_node}" for h in self.nodes)
        command = [
            "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--tag-output",
            "--mca", "plm_rsh_agent", str(self.agent),
            "--mca", "oob_tcp_if_include", MPI_NET, "--mca", "btl_tcp_if_include", MPI_NET, "--mca", "btl", "tcp,self",
            "-H", spec, "-np", str(ranks_per_node * len(self.nodes)),
        ]  # fmt: skip
        for name in exported:
            if name in env:
                command += ["-x", name]
        return command + argv

    # -- helpers -----------------------------------------------------------------------------------------
    def _port(self, host: Host) -> str:
        return f"p{host.name}"

    def _mac(self, host: Host) -> str:
        out = subprocess.run(["ip", "-n", host.namespace, "-j", "link", "show", "eth0"], capture_output=True,
                             text=True, check=True)  # fmt: skip
        return json.loads(out.stdout)[0]["address"]


def sweep_stale() -> None:
    """Delete the namespaces (and their processes) of clusters whose test process is gone (killed before its
    clean-up ran): their names carry the maker's pid."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    for line in listed:
        match = re.match(r"(hm(\d+)(?:br|node\d+|trk))\b", line)
        if match is None or _maker_alive(int(match.group(2))):
            continue
        for pid in _pids(match.group(1)):
            _kill(pid, signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", match.group(1)], capture_output=True)


def _maker_alive(short_pid: int) -> bool:
    return any(pid % 100000 == short_pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))))


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _pids(namespace: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
