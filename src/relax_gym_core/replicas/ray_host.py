"""The Ray side of RayLauncher: a Ray driver in the NeMo Gym environment (the one module importing Ray).

    python -m relax_gym_core.replicas.ray_host --address ADDRESS [--resources JSON] [--ping-timeout S]
        [--probe-interval S]

One host per launcher. It joins the cluster, then reads one JSON request per line on stdin and answers
each (in any order, concurrently) with one JSON line on stdout carrying the request's "id":

    {"op": "start", "name", "config", "servers": [...], "timeout_s"}
        -> {"replica": ID, "urls": {...}, "node_id", "node_ip", "pid", "server_pids": [...]}
    {"op": "stop", "replica": ID}   -> {"left": [pids still running]}
    {"op": "close"}                 -> {"left": [...]}, then the host exits
    any failure                     -> {"error": message}

Unasked, {"event": "lost", "replica": ID, "reason"} reports a replica found dead (its actor gone, a
server process exited, its node lost): every live replica is pinged each probe interval. The first
line is {"ready": true, "nodes": [...]} or {"error": ...}. End of stdin (the launcher's process is
gone) is a close. Every replica is one actor that starts and owns its servers' processes (the way
processes.run_gym_servers does, on the actor's node address, forked from a fork server of its own: one
NeMo Gym import per replica, not one per server); the actors are not detached, so Ray kills them with
this driver, and their servers die with them (the fork server stops them when the actor's end of its pipe
closes, and they have PR_SET_PDEATHSIG to it). Imports: the standard library, Ray and the core's modules
that need nothing else (gym.ports, gym.stop, gym.spawn; the others need packages this environment does not
have: the launcher builds the config).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError  # type: ignore[import-not-found]

import ray  # type: ignore[import-not-found] # the NeMo Gym environment's, untyped for mypy here
from relax_gym_core.gym.ports import answers_root, free_ports  # standard library only
from relax_gym_core.gym.spawn import ServerProcess, spawn_server  # standard library only
from relax_gym_core.gym.stop import stop_processes  # standard library only

PLACEMENT_GRACE_S = 60.0  # on top of the servers' startup timeout: a worker process to start on the node
STOP_TIMEOUT_S = 15.0  # a replica's servers: SIGINT to all, then SIGKILL (gym.stop's default budget)
SHUTDOWN_TIMEOUT_S = 120.0  # a replica's servers, one after the other


@ray.remote(max_restarts=0, max_task_retries=0)
class ReplicaActor:
    """One replica: its NeMo Gym servers, started on this actor's node, dying with this process."""

    def __init__(self) -> None:
        self.processes: dict[str, ServerProcess] = {}
        self.logs = Path(tempfile.mkdtemp(prefix="relax-gym-replica-"))

    def start(
        self, name: str, config: dict[str, Any], servers: list[dict[str, str]], timeout_s: float
    ) -> dict[str, Any]:
        # Servers listen on the node's address, the one the gateway (and the other nodes) reach it at.
        host = ray.util.get_node_ip_address()
        ports = dict(zip((s["name"] for s in servers), free_ports(len(servers), host), strict=True))
        config["head_server"]["host"] = host
        if config.get("observability_enabled") and not config.get("model_call_capture_dir"):
            # NeMo Gym's model servers (an LLM judge's) then capture their calls: into this replica's own
            # directory, gone with it (relax_gym_core.gym.processes does the same locally).
            config["model_call_capture_dir"] = str(self.logs / "model-calls")
        for server in servers:
            instance = config[server["name"]][server["kind"]][server["implementation"]]
            instance.update(host=host, port=ports[server["name"]])
        urls = {server["name"]: f"http://{host}:{ports[server['name']]}" for server in servers}
        for server in servers:
            # The node's NeMo Gym environment (Ray runs from it); $RELAX_GYM_FORK_SERVER=0 on the node starts
            # each server as its own interpreter instead.
            self.processes[server["name"]] = spawn_server(
                sys.executable,
                [
                    *("--server-class", server["server_class"]),
                    *("--upstream", f"{server['kind']}.{server['implementation']}"),
                ],
                env={
                    **os.environ,
                    "NEMO_GYM_CONFIG_DICT": json.dumps(config),
                    "NEMO_GYM_CONFIG_PATH": server["name"],
                    "HF_HOME": str(self.logs / "hf"),  # NeMo Gym writes caches into the working dir
                },
                cwd=str(self.logs),
                log=self.logs / f"{server['name']}.log",
            )
        try:
            self._wait_ready(name, urls, timeout_s)
        except BaseException:
            self.shutdown()
            raise
        return {
            "urls": urls,
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": host,
            "pid": os.getpid(),
            "server_pids": [process.pid for process in self.processes.values()],
        }

    def _wait_ready(self, replica: str, urls: Mapping[str, str], timeout_s: float) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
        pending = dict(urls)
        stop = time.monotonic() + timeout_s
        while pending:
            for name, url in list(pending.items()):
                code = self.processes[name].poll()
                if code is not None:
                    raise RuntimeError(
                        f"NeMo Gym server {name!r} of replica {replica} exited with code {code}:\n"
                        + self._tail(name)
                    )
                if answers_root(opener, url):
                    del pending[name]
            if pending and time.monotonic() > stop:
                raise RuntimeError(
                    f"NeMo Gym server(s) {', '.join(sorted(pending))} of replica {replica} not ready after "
                    f"{timeout_s:.0f} s on node {ray.util.get_node_ip_address()}"
                )
            if pending:
                time.sleep(0.2)

    def _tail(self, name: str, lines: int = 30) -> str:
        try:
            text = (self.logs / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def ping(self) -> dict[str, int]:
        """The servers that exited, with their exit codes (empty: all running)."""
        return {
            name: code for name, process in self.processes.items() if (code := process.poll()) is not None
        }

    def shutdown(self) -> list[int]:
        """Stop every server (SIGINT, then SIGKILL); the PIDs still running after that (none expected)."""
        stop_processes(self.processes.values(), timeout_s=STOP_TIMEOUT_S)
        shutil.rmtree(self.logs, ignore_errors=True)  # the servers' logs and caches: nothing left behind
        return [process.pid for process in self.processes.values() if process.poll() is None]


def _actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """Ray's options for one replica: exactly these resources, spread over the nodes."""
    custom = {key: value for key, value in resources.items() if key not in ("CPU", "GPU", "memory")}
    options: dict[str, Any] = {
        "num_cpus": resources.get("CPU", 0),
        "num_gpus": resources.get("GPU", 0),
        "resources": custom,
        # SPREAD, not a STRICT_SPREAD placement group: replicas start (and are replaced) one at a time,
        # and a group would need every bundle placeable up front. Resources that a node holds once per
        # replica (e.g. {"relax_gym_replica": 1}) make "one replica per node" a guarantee, not a hope.
        "scheduling_strategy": "SPREAD",
    }
    if "memory" in resources:
        options["memory"] = resources["memory"]
    return options


class Host:
    def __init__(self, resources: Mapping[str, float], ping_timeout_s: float) -> None:
        self.options = _actor_options(resources)
        self.ping_timeout_s = ping_timeout_s
        self.replicas: dict[int, Any] = {}
        self.dead: dict[int, str] = {}  # a replica found dead stays dead (and its actor is killed)
        self.ids = itertools.count()
        self.lock = threading.Lock()
        self.closing = False

    def start(self, request: Mapping[str, Any]) -> dict[str, Any]:
        actor = ReplicaActor.options(**self.options).remote()  # type: ignore[attr-defined]
        timeout_s = float(request["timeout_s"])
        name = request["name"]
        ref = actor.start.remote(name, request["config"], request["servers"], timeout_s)
        try:
            info: dict[str, Any] = ray.get(ref, timeout=timeout_s + PLACEMENT_GRACE_S)
        except GetTimeoutError:
            ray.kill(actor, no_restart=True)
            return {
                "error": f"replica {name} not started within {timeout_s + PLACEMENT_GRACE_S:.0f} s: is a "
                f"node with {json.dumps(self._wanted())} free? (cluster: "
                f"{json.dumps(ray.cluster_resources())}, available: {json.dumps(ray.available_resources())})"
            }
        except RayTaskError as error:
            ray.kill(actor, no_restart=True)
            return {"error": str(error.cause) if error.cause is not None else str(error)}
        except RayActorError as error:
            return {"error": f"replica {name}'s actor died while starting: {error}"}
        with self.lock:
            closing = self.closing
            replica = next(self.ids)
            if not closing:
                self.replicas[replica] = actor
        if closing:  # started while closing: nothing may outlive close
            self.replicas[replica] = actor
            self.stop({"replica": replica})
            return {"error": f"replica {name}: the launcher closed while it started"}
        return {"replica": replica, **info}

    def _wanted(self) -> dict[str, float]:
        cpus = {"CPU": self.options["num_cpus"]} if self.options["num_cpus"] else {}
        return {**cpus, **self.options["resources"]}

    def _why_dead(self, ping: Any, timeout_s: float) -> str | None:
        """None if the replica answered its ping with every server running, else what is wrong."""
        try:
            exited: dict[str, int] = ray.get(ping, timeout=timeout_s)
        except RayActorError as error:  # killed, crashed, or its node is gone
            return f"actor dead: {type(error).__name__}"
        except GetTimeoutError:
            return f"actor did not answer within {self.ping_timeout_s:.0f} s"
        except Exception as error:  # noqa: BLE001 - any other failure of the ping: it cannot be trusted
            return f"ping failed: {type(error).__name__}: {error}"
        if not exited:
            return None
        return "server exited: " + ", ".join(f"{name} (code {code})" for name, code in sorted(exited.items()))

    def watch(self, report: Callable[[Mapping[str, Any]], None], interval_s: float) -> None:
        """Ping every live replica each interval; report each one found dead once (and kill its actor:
        dead is final, what is left of it goes too). The launcher's alive() reads these reports."""
        while not self.closing:
            time.sleep(interval_s)
            with self.lock:
                live = {r: actor for r, actor in self.replicas.items() if r not in self.dead}
            pings = {replica: actor.ping.remote() for replica, actor in live.items()}
            deadline = time.monotonic() + self.ping_timeout_s
            for replica, ping in pings.items():
                reason = self._why_dead(ping, max(0.0, deadline - time.monotonic()))
                if reason is None:
                    continue
                with self.lock:
                    if replica not in self.replicas or replica in self.dead:
                        continue  # stopped meanwhile
                    self.dead[replica] = reason
                with contextlib.suppress(Exception):  # gone already, or its node is
                    ray.kill(live[replica], no_restart=True)
                report({"id": None, "event": "lost", "replica": replica, "reason": reason})

    def stop(self, request: Mapping[str, Any]) -> dict[str, Any]:
        replica = int(request["replica"])
        with self.lock:
            actor = self.replicas.pop(replica, None)
            self.dead.setdefault(replica, "stopped")
        if actor is None:
            return {"left": []}
        left: list[int] = []
        # Dead already (its servers died with it), or stuck: killed below either way.
        with contextlib.suppress(RayActorError, GetTimeoutError):
            left = ray.get(actor.shutdown.remote(), timeout=SHUTDOWN_TIMEOUT_S)
        ray.kill(actor, no_restart=True)
        self._wait_dead(actor)
        return {"left": left}

    def _wait_dead(self, actor: Any) -> None:
        """Until Ray reports the actor dead (a call on it fails), within a bound."""
        stop = time.monotonic() + 60.0
        while time.monotonic() < stop:
            try:
                ray.get(actor.ping.remote(), timeout=5.0)
            except RayActorError:
                return
            except GetTimeoutError:
                continue
            time.sleep(0.1)

    def close(self) -> dict[str, Any]:
        with self.lock:
            self.closing = True
            replicas = list(self.replicas)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(replicas))) as pool:
            answers = list(pool.map(lambda replica: self.stop({"replica": replica}), replicas))
        return {"left": [pid for answer in answers for pid in answer["left"]]}


def _serve(host: Host, out: Any, probe_interval_s: float) -> None:
    write_lock = threading.Lock()

    def answer(body: Mapping[str, Any]) -> None:
        # The launcher may be gone (its process died: that is why stdin ended); the work is done anyway.
        with write_lock, contextlib.suppress(BrokenPipeError):
            out.write(json.dumps(body) + "\n")
            out.flush()

    handlers = {"start": host.start, "stop": host.stop}
    threading.Thread(target=host.watch, args=(answer, probe_interval_s), daemon=True).start()

    def handle(request: dict[str, Any]) -> None:
        try:
            body = handlers[request["op"]](request)
        except Exception as error:  # noqa: BLE001 - answered to the launcher, which raises it
            body = {"error": f"{type(error).__name__}: {error}"}
        answer({"id": request.get("id"), **body})

    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        for line in sys.stdin:
            request = json.loads(line)
            if request.get("op") == "close":
                break
            pool.submit(handle, request)
        else:
            request = {"id": None}  # end of stdin: the launcher is gone
        result = host.close()
    answer({"id": request.get("id"), **result})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--resources", default="{}", help='per replica, e.g. {"CPU": 2}')
    parser.add_argument("--ping-timeout", type=float, default=10.0)
    parser.add_argument("--probe-interval", type=float, default=0.5)
    args = parser.parse_args(argv)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # Ray's own output goes to stderr: stdout carries only our answers
    try:
        ray.init(address=args.address, log_to_driver=False, logging_level="warning")
    except Exception as error:  # noqa: BLE001 - reported to the launcher, which names the address
        out.write(json.dumps({"error": f"{type(error).__name__}: {error}"}) + "\n")
        out.flush()
        raise SystemExit(2) from None
    nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
    out.write(json.dumps({"ready": True, "nodes": nodes}) + "\n")
    out.flush()
    try:
        _serve(Host(json.loads(args.resources), args.ping_timeout), out, args.probe_interval)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    # Run as the module's own name, not __main__: Ray pickles the actor class by reference to it.
    from relax_gym_core.replicas import ray_host  # noqa: PLW0406

    ray_host.main()
