"""RayLauncher on a real two-node Ray cluster simulated on this machine: workplace_assistant replicas
placed by Ray on different nodes, each a Ray actor owning real NeMo Gym server processes.

The cluster is Ray's own test utility (`ray.cluster_utils.Cluster`) run by tests/ray/cluster_main.py in the
NeMo Gym environment, once for the module (Ray is heavy): every component on 127.0.0.1, no dashboard, each
node holding one unit of the custom resource `relax_gym_replica`. The tests learn the PIDs of everything
under it (GCS, raylets, agents, workers, actors and the servers they start) and assert none is left.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from relax_gym_core.client import GatewayClient
from relax_gym_core.gym.processes import gym_python, stop_process
from relax_gym_core.plugin.host import make_plugin_manager
from relax_gym_core.replicas.ray import RayLauncher, RayReplica
from relax_gym_core.replicas.spec import ReplicaSpec, replica_names
from relax_gym_core.testing import Gate
from relax_gym_core.testing.web import start_up

from ..replicas.support import (
    ENVIRONMENT,
    OPTIONS,
    RESOURCES,
    HeldPolicy,
    alive,
    eventually,
    lose_two_of_four,
    parent_of,
    process_stat,
    replica_counts,
    replicas_of,
    sessions,
    settle_completed,
)

# One worker runs both tests under `--dist loadgroup`: the module's cluster starts once, not once per worker.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.xdist_group("ray-cluster")]

STARTUP_TIMEOUT_S = 600.0  # NeMo Gym servers on a 2-core host shared with a Ray cluster


def until(condition: Callable[[], bool], what: str, bound_s: float = 120.0) -> None:
    """`eventually` for the launcher, which is driven without an event loop."""
    stop = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > stop:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.2)


def spec(name: str) -> ReplicaSpec:
    definition = make_plugin_manager().environments.get(ENVIRONMENT)
    # No model calls here: the gateway's address is only written into the agents' config.
    return ReplicaSpec(name=name, servers=definition.servers, gateway_host="127.0.0.1", gateway_port=9)


def answers(replica: RayReplica) -> bool:
    with httpx.Client(trust_env=False, timeout=10) as http:
        roots = [http.get(f"{url}/").status_code for url in replica.urls.values()]
        sessions = http.get(f"{replica.urls[RESOURCES]}/relax_gym/sessions").json()
    return roots == [200] * len(replica.urls) and sessions["sessions"] == 0


def working_dirs(pids: list[int]) -> set[Path]:
    """The servers' working directories (their logs): a replica removes its own when stopped; one that
    died hard (actor or node killed) cannot, and the test removes what it left."""
    found = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            found.add(Path(os.readlink(f"/proc/{pid}/cwd")))
    return found


FORK_SERVER = "relax_gym_core.gym.forkserver"


def is_server(pid: int) -> bool:
    """A NeMo Gym server process: forked by a replica's fork server (the default), or its own interpreter."""
    line = command_line(pid)
    return "relax_gym_core.gym.launch" in line or (
        FORK_SERVER in line and FORK_SERVER in command_line(parent_of(pid))
    )


def of_gym(pid: int) -> bool:
    """A server, or the fork server of one."""
    return "relax_gym_core.gym.launch" in command_line(pid) or FORK_SERVER in command_line(pid)


def server_pids(cluster: RayCluster) -> list[int]:
    return [pid for pid in cluster.processes() if is_server(pid)]


def gone(pids: tuple[int, ...]) -> bool:
    return not any(alive(pid) for pid in pids)


CLUSTER_MAIN = Path(__file__).with_name("cluster_main.py")
# Ray starts many Python processes (agents, workers) that import much of Ray: with bytecode caching off
# ($PYTHONDONTWRITEBYTECODE) each compiles it again, seconds of CPU apiece. They cache it here instead,
# outside the installed packages.
PYCACHE = Path(__file__).resolve().parents[2] / ".gym" / "pycache"
REPLICA_RESOURCE = "relax_gym_replica"


def descendants(root: int) -> dict[int, str]:
    """PID -> start time of every live process below `root` (the start time tells a reused PID apart)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := process_stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for pid, started in children.get(todo.pop(), []):
            found[pid] = started
            todo.append(pid)
    return found


def still_running(processes: dict[int, str]) -> list[int]:
    return sorted(
        pid for pid, started in processes.items() if (s := process_stat(pid)) is not None and s[1] == started
    )


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _address(hex_address: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)  # /proc/net/tcp*: 32-bit words in host (little-endian) order
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(packed), int(port, 16)


def listening(pids: list[int]) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """The TCP addresses these processes listen on (from /proc, as `ss -ltnp` would show them)."""
    inodes = set().union(*(_socket_inodes(pid) for pid in pids)) if pids else set()
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(_address(fields[1]))
    return found


def is_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


class RayCluster:
    def __init__(self, process: subprocess.Popen[str], info: dict[str, Any]) -> None:
        self.process = process
        self.address: str = info["address"]
        self.node_ids: list[str] = [node["node_id"] for node in info["nodes"]]

    def remove_node(self, index: int) -> None:
        """Cluster.remove_node on a worker node: its raylet and everything on it go."""
        stdin: IO[str] | None = self.process.stdin
        assert stdin is not None and self.process.stdout is not None
        stdin.write(f"remove {index}\n")
        stdin.flush()
        assert json.loads(self.process.stdout.readline()) == {"removed": self.node_ids[index]}
        self.node_ids[index] = ""

    def add_node(self) -> str:
        """A node like the others (one unit of the replica resource)."""
        stdin: IO[str] | None = self.process.stdin
        assert stdin is not None and self.process.stdout is not None
        stdin.write("add\n")
        stdin.flush()
        node_id: str = json.loads(self.process.stdout.readline())["added"]
        self.node_ids.append(node_id)
        return node_id

    @property
    def live_node_ids(self) -> set[str]:
        return {node for node in self.node_ids if node}

    def processes(self) -> dict[int, str]:
        return descendants(self.process.pid)


def _start_cluster(base: str) -> tuple[subprocess.Popen[str], dict[str, Any]] | None:
    process = subprocess.Popen(
        [gym_python(), str(CLUSTER_MAIN), "2", base],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ray_environ(),
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if line:
        return process, json.loads(line)
    stop_process(process, signal.SIGTERM, timeout_s=120)  # it failed and cleaned up after itself
    _close(process)
    return None


def ray_environ() -> dict[str, str]:
    environ = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    environ.setdefault("PYTHONPYCACHEPREFIX", str(PYCACHE))  # `make test` sets one for every process
    return {**environ, "RAY_USAGE_STATS_ENABLED": "0"}


def _close(process: subprocess.Popen[str]) -> None:
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            stream.close()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    with tempfile.TemporaryDirectory(prefix="rg-ray-") as base:  # short: Ray's socket paths must fit
        # A raylet gives its node's agents 15 s to report their ports, then aborts: on a busy 2-core host
        # a node's start can fail. Such a start leaves nothing behind; it is tried again.
        started = None
        for _ in range(3):
            started = _start_cluster(base)
            if started is not None:
                break
        if started is None:
            pytest.fail("the Ray test cluster did not start in 3 attempts (see stderr)")
        process, info = started
        cluster = RayCluster(process, info)
        seen: dict[int, str] = {}
        try:
            yield cluster
        finally:
            seen = cluster.processes()
            stop_process(process, signal.SIGTERM, timeout_s=120)
            _close(process)
        # Every raylet, GCS, agent, worker and actor this cluster ran is gone, not just the cluster's
        # own process.
        assert still_running(seen) == []


def test_replicas_spread_over_nodes_die_visibly_and_leave_nothing(
    ray_cluster: RayCluster, request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()
    launcher = RayLauncher(ray_cluster.address, {REPLICA_RESOURCE: 1})
    # Closed however the test ends (close() is idempotent): a failure midway would otherwise leave its host
    # process's pipes and its log directory to the garbage collector, in the next test on this worker.
    request.addfinalizer(launcher.close)
    host_pid = launcher._process.pid
    names = replica_names(ENVIRONMENT, 3)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        first, second = pool.map(
            lambda name: launcher.start(spec(name), startup_timeout_s=STARTUP_TIMEOUT_S), names[:2]
        )
    print(f"2 replicas up in {time.monotonic() - started:.1f} s")  # noqa: T201 - reported timing

    # Ray placed them on different nodes (each node holds one unit of the resource they ask for); each
    # listens on its node's address, answers, and runs its servers under its actor.
    assert {first.location, second.location} == ray_cluster.live_node_ids
    assert first.node_ip == second.node_ip == "127.0.0.1"
    assert answers(first) and answers(second)
    assert first.alive() and second.alive()
    for replica in (first, second):
        assert "ReplicaActor" in command_line(replica.actor_pid)
        assert set(replica.server_pids) <= set(descendants(replica.actor_pid))
        assert all(is_server(pid) for pid in replica.server_pids)
    dirs = working_dirs([*first.server_pids, *second.server_pids])
    assert len(dirs) == 2  # one per replica
    # Nothing of the cluster, the host or the replicas listens beyond loopback.
    ours = [*ray_cluster.processes(), *descendants(os.getpid())]
    addresses = listening(ours)
    assert addresses and [a for a, _ in addresses if not is_loopback(a)] == []

    # 1. The actor's process dies: the handle says so, and its servers died with it (its fork server sees
    # the actor's end of its pipe close and stops them).
    os.kill(first.actor_pid, signal.SIGKILL)
    until(lambda: not first.alive(), "a killed actor's replica reported dead")
    until(lambda: gone(first.server_pids), "the killed actor's servers gone")
    assert second.alive()
    assert not first.alive()  # dead is final

    # A replacement takes the freed node (the survivor's node has no replica resource left).
    third = launcher.start(spec(names[2]), startup_timeout_s=STARTUP_TIMEOUT_S)
    assert third.location == first.location and answers(third)
    dirs |= working_dirs(list(third.server_pids))

    # 2. The node of one replica is lost (Cluster.remove_node: its raylet and everything on it).
    on_worker, on_head = (third, second) if third.location == ray_cluster.node_ids[1] else (second, third)
    ray_cluster.remove_node(1)
    until(lambda: not on_worker.alive(), "a replica on a removed node reported dead")
    until(lambda: gone(on_worker.server_pids), "the removed node's servers gone")
    assert on_head.alive()

    # 3. One server process of a replica exits: the replica is dead.
    os.kill(on_head.server_pids[0], signal.SIGKILL)
    until(lambda: not on_head.alive(), "a replica whose server exited reported dead")

    # close(): every actor killed, every server process gone, the host gone; the handles stay dead.
    replicas = (first, second, third)
    launcher.close()
    launcher.close()  # idempotent
    for replica in replicas:
        replica.stop()  # idempotent, and harmless after close
        assert not replica.alive()
    left = [p for p in descendants(ray_cluster.process.pid) if "ReplicaActor" in command_line(p)]
    assert left == []
    assert gone(tuple(pid for replica in replicas for pid in (replica.actor_pid, *replica.server_pids)))
    assert still_running({host_pid: "any"}) == [] or gone((host_pid,))
    assert [p for p in descendants(ray_cluster.process.pid) if of_gym(p)] == []
    print(f"whole run {time.monotonic() - started:.1f} s")  # noqa: T201 - reported timing
    for directory in dirs:  # every replica here died hard: nothing could remove its logs
        shutil.rmtree(directory, ignore_errors=True)
    ray_cluster.add_node()  # two nodes again for the next test


# ---- `relax-gym up --replicas 2 --ray ADDRESS`: one gateway, trials on both nodes ---------------------


@pytest.mark.anyio
async def test_up_with_ray_replicas_runs_trials_on_both_nodes_and_survives_a_lost_node(
    ray_cluster: RayCluster,
) -> None:
    started = time.monotonic()
    args = ("--replicas", "2", "--ray", ray_cluster.address, "--max-concurrency", "32")
    args += ("--replica-resources", json.dumps({REPLICA_RESOURCE: 1}))
    env = {"RELAX_GYM_REPLICA_PROBE_INTERVAL_S": "0.2", "RELAX_GYM_REPLICA_RESTART_DELAY_S": "2"}
    with HeldPolicy("ray") as policy, start_up([ENVIRONMENT], env=env, extra_args=args) as gateway:
        print(f"`up --replicas 2 --ray` ready in {time.monotonic() - started:.1f} s")  # noqa: T201
        replicas = replicas_of(gateway)
        assert sorted(replicas) == ["workplace_assistant#0", "workplace_assistant#1"]
        # One per node.
        assert {servers[RESOURCES].node for servers in replicas.values()} == ray_cluster.live_node_ids
        resources = [servers[RESOURCES].url for servers in replicas.values()]
        assert await replica_counts(gateway) == {"wanted": 2, "healthy": 2, "starting": 0, "lost": 0}
        here = descendants(gateway.pid)  # the Ray host (a driver of the cluster) runs under `up`
        dirs = working_dirs(server_pids(ray_cluster))
        assert len(dirs) == 2

        async with GatewayClient(gateway.url, options=OPTIONS) as client:
            # ---- four trials held at their first model call: two on each node, all cleaned up there ----
            gate = Gate()
            batch = await policy.start_held(client, gate, 4)
            assert [await sessions(url) for url in resources] == [2, 2]
            gate.open()
            await settle_completed(client, batch)
            assert [await sessions(url) for url in resources] == [0, 0]

            # ---- a node is lost mid-run: its replica's trials fail typed, the other node's go on -------
            gate = Gate()
            batch = await policy.start_held(client, gate, 4)
            assert [await sessions(url) for url in resources] == [2, 2]
            worker = next(i for i, node in enumerate(ray_cluster.node_ids) if i > 0 and node)
            ray_cluster.remove_node(worker)
            running = await lose_two_of_four(client, batch)
            counts = await replica_counts(gateway)
            assert (counts["healthy"], counts["lost"]) == (1, 1)

            # ---- a node joins: the replacement is placed there -----------------------------------------
            new_node = ray_cluster.add_node()

            async def replaced() -> bool:
                return (await replica_counts(gateway))["healthy"] == 2

            await eventually(replaced, "a replacement replica on the new node")
            assert replicas_of(gateway)["workplace_assistant#2"][RESOURCES].node == new_node
            survivors = working_dirs(server_pids(ray_cluster))
            assert len(survivors) == 2
            gate.open()
            await settle_completed(client, running)
        here.update(descendants(gateway.pid))
    # `up` stopped (SIGTERM): every replica's actor and servers are gone from every node, and the host too.
    assert [p for p in ray_cluster.processes() if "ReplicaActor" in command_line(p)] == []
    assert [p for p in ray_cluster.processes() if of_gym(p)] == []
    assert still_running(here) == []
    assert [d for d in survivors if d.exists()] == []  # stopped replicas removed their logs
    for directory in dirs - survivors:  # the lost node's replica could not
        shutil.rmtree(directory, ignore_errors=True)
    print(f"`up --ray` test {time.monotonic() - started:.1f} s")  # noqa: T201 - reported timing
