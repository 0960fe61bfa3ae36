"""A simulated multi-node Ray cluster on this machine, for tests (runs INSIDE the NeMo Gym environment).

    python tests/ray/cluster_main.py NODES TEMP_DIR

Starts Ray's own test cluster (`ray.cluster_utils.Cluster`): NODES nodes, each with one unit of the custom
resource `relax_gym_replica` (so replicas asking for it must land on different nodes), every component on
127.0.0.1, no dashboard, no usage stats. Prints one JSON line {"address", "nodes": [{"node_id", "index"}]},
then takes commands on stdin, one per line, each answered with one JSON line: `remove INDEX` removes
that worker node (Cluster.remove_node), `add` adds a node like the others. SIGTERM or end of stdin
shuts the whole cluster down (every raylet, GCS and worker) and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from typing import Any

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

from ray.cluster_utils import Cluster

NODE_ARGS: dict[str, Any] = {
    "node_ip_address": "127.0.0.1",
    "include_dashboard": False,
    "num_cpus": 1,
    "resources": {"relax_gym_replica": 1},
}


def _node_args() -> dict[str, Any]:
    """NODE_ARGS plus the agents' ports chosen here: given a port, the raylet does not wait (15 s at most,
    then it aborts) for the dashboard agent to report the one it picked, which a busy host can exceed."""
    sockets = [socket.socket() for _ in range(4)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    names = (
        "metrics_agent_port",
        "metrics_export_port",
        "dashboard_agent_listen_port",
        "runtime_env_agent_port",
    )
    return {**NODE_ARGS, **dict(zip(names, ports, strict=True))}


def _answer(out: Any, body: dict[str, Any]) -> None:
    out.write(json.dumps(body) + "\n")
    out.flush()


def main() -> None:
    count, base = int(sys.argv[1]), sys.argv[2]
    # Ray keeps its sessions and the "current cluster" file under $RAY_TMPDIR/ray: ours, not /tmp/ray.
    os.environ["RAY_TMPDIR"] = base
    temp_dir = os.path.join(base, "ray")
    os.makedirs(temp_dir, exist_ok=True)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # Ray's own chatter goes to stderr; stdout carries only our lines
    cluster = Cluster(initialize_head=True, head_node_args={**_node_args(), "temp_dir": temp_dir})
    nodes = [cluster.head_node]
    for _ in range(count - 1):
        nodes.append(cluster.add_node(**_node_args()))
    cluster.wait_for_nodes()

    def stop(*_: Any) -> None:
        cluster.shutdown()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    _answer(
        out,
        {
            "address": cluster.address,
            "nodes": [{"index": index, "node_id": node.node_id} for index, node in enumerate(nodes)],
        },
    )
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "remove":
            node = nodes[int(argument)]
            cluster.remove_node(node)
            _answer(out, {"removed": node.node_id})
        elif command == "add":
            nodes.append(cluster.add_node(**_node_args()))
            cluster.wait_for_nodes()
            _answer(out, {"added": nodes[-1].node_id})
    stop()


if __name__ == "__main__":
    main()
