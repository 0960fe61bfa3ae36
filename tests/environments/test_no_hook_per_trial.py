"""No pluggy hook runs on a trial's path: the gateway asks the plugins once, at start-up (their environment
objects and runtime factories), and every trial after that calls those objects directly."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from attrs import field, frozen
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from relax_gym_core.gateway import GatewaySettings, create_app, parse_environments
from relax_gym_core.plugin import (
    STATELESS,
    EnvironmentDefinition,
    EnvironmentRegistrar,
    NemoGymServer,
    RunResult,
    RuntimeRegistrar,
    hookimpl,
)
from relax_gym_core.plugin.host import Hooks, make_plugin_manager
from relax_gym_core.plugin.specs import EnvironmentSpec
from relax_gym_core.protocol import Generation
from relax_gym_core.runtimes import CLEANUP_CONFIRMED, CleanupResult, RunContext
from relax_gym_core.testing.web import serve_in_thread

TRIALS = 4  # per environment
AGENT = NemoGymServer(
    name="agent", kind="responses_api_agents", implementation="simple_agent", server_class="m:C"
)


@frozen(kw_only=True)
class Counted(EnvironmentDefinition):
    """Counts the calls of its methods (in `calls`), so the trials are known to have gone through this
    object; otherwise the reference behaviour."""

    calls: Counter[str] = field(factory=Counter, eq=False)

    def build_run_body(self, task: dict[str, Any], generation: Generation, rollout_id: str) -> dict[str, Any]:
        self.calls["build_run_body"] += 1
        return super().build_run_body(task, generation, rollout_id)

    def map_result(self, body: dict[str, Any]) -> RunResult:
        self.calls["map_result"] += 1
        return super().map_result(body)


class Run:
    placement = None

    def __init__(self, environment: EnvironmentDefinition) -> None:
        self.environment = environment

    async def wait(self) -> RunResult:
        return self.environment.map_result({"reward": 0.5, "response": {"output": []}})

    async def abort(self) -> CleanupResult:
        return CLEANUP_CONFIRMED

    async def force_cleanup(self) -> CleanupResult:
        return CLEANUP_CONFIRMED

    async def probe_cleanup(self) -> CleanupResult:
        return CLEANUP_CONFIRMED


class LocalRuntime:
    """A plugin's own runtime: its runs map their answer with the environment object it was built with."""

    def __init__(self, environment: EnvironmentDefinition) -> None:
        self.environment = environment

    async def start(self, context: RunContext) -> Run:
        del context
        return Run(self.environment)

    def handle_for(self, rollout_id: str, placement: str | None = None) -> Run:
        del rollout_id, placement
        return Run(self.environment)

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        return None


class Plugin:
    """Registers one environment run by a NeMo Gym agent and one run by its own runtime, and counts every
    call the core makes into it (its hookimpls and its runtime factory)."""

    def __init__(self, calls: Counter[str]) -> None:
        self.calls = calls

    def environment(self, **fields: Any) -> Counted:
        return Counted(configs=("c",), cleanup=STATELESS, calls=self.calls, **fields)

    @hookimpl
    def register_environments(self, registrar: EnvironmentRegistrar) -> None:
        self.calls["register_environments"] += 1
        registrar.add(self.environment(name="scripted", agent="agent", servers=(AGENT,)))
        registrar.add(self.environment(name="own", agent="local", servers=(), runtime="local"))

    @hookimpl
    def register_runtimes(self, registrar: RuntimeRegistrar) -> None:
        self.calls["register_runtimes"] += 1
        registrar.add("local", self.factory)

    def factory(self, spec: EnvironmentSpec, environment: EnvironmentDefinition) -> LocalRuntime:
        del spec
        self.calls["runtime factory"] += 1
        return LocalRuntime(environment)


@pytest.fixture
def scripted_agent() -> Iterator[str]:
    """A NeMo Gym agent stand-in: POST /run answers the reward the task's metadata asks for (the reference
    /run body carries the task's metadata at its top level)."""

    async def run(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"reward": body["echo"]["reward"], "response": {"output": []}})

    with serve_in_thread(Starlette(routes=[Route("/run", run, methods=["POST"])])) as server:
        yield server.url


class HookCalls:
    """pluggy's hook call monitoring on a plugin manager: the name of every hook called through it."""

    def __init__(self, hooks: Hooks) -> None:
        self.names: list[str] = []

        def before(name: str, _impls: object, _kwargs: Mapping[str, Any]) -> None:
            self.names.append(name)

        def after(_outcome: object, _name: str, _impls: object, _kwargs: Mapping[str, Any]) -> None:
            return None

        self.undo = hooks.pm.add_hookcall_monitoring(before, after)


def settled(client: TestClient, request_id: str) -> dict[str, Any]:
    stop = time.monotonic() + 60  # a safety net only: the trials settle in well under a second
    while True:
        snapshot: dict[str, Any] = client.get(f"/v1/trials/{request_id}").json()
        if snapshot["cleanup"] != "pending" or time.monotonic() > stop:
            return snapshot
        time.sleep(0.01)


def test_trials_call_the_registered_objects_and_no_hook(
    scripted_agent: str, make_body: Callable[..., dict[str, Any]]
) -> None:
    calls: Counter[str] = Counter()
    hooks = make_plugin_manager(load_entry_points=False, plugins=[("plugin", Plugin(calls))])
    specs = {
        "scripted": {"environment": "scripted", "agent_url": scripted_agent, "agent_name": "agent"},
        "own": {"environment": "own", "runtime": "local"},
    }
    for spec in specs.values():
        spec.update(stateless=True, max_concurrency=TRIALS, queue_capacity=TRIALS)
    environments = parse_environments(json.dumps(specs), source="test")
    app = create_app(GatewaySettings(environments=environments, scan_interval_s=0.01), hooks=hooks)
    with TestClient(app) as client:
        # Start-up asked the plugins once: each registration hook, the runtime factory for its spec.
        assert calls == {"register_environments": 1, "register_runtimes": 1, "runtime factory": 1}
        monitored = HookCalls(hooks)
        bodies = [
            make_body(env=env, config=env, echo={"reward": index / 10})
            for index in range(TRIALS)
            for env in ("scripted", "own")
        ]
        for body in bodies:
            assert client.post("/v1/trials", json=body).status_code == 202
        snapshots = [settled(client, body["request_id"]) for body in bodies]
        during_trials = list(monitored.names)
        counted = dict(calls)
        # The monitor sees a hook called through the plugin manager (so an empty list above is a finding).
        hooks.pm.hook.register_runtimes(registrar=RuntimeRegistrar({}, "monitor check"))
        assert monitored.names[len(during_trials) :] == ["register_runtimes"]
        monitored.undo()

    assert [(s["status"], s["cleanup"]) for s in snapshots] == [("completed", "confirmed")] * len(bodies)
    assert [s["reward"] for s in snapshots] == [
        index / 10 if env == "scripted" else 0.5 for index in range(TRIALS) for env in ("scripted", "own")
    ]
    assert during_trials == []  # no pluggy hook was called while the trials ran
    # Each trial called the environment objects directly: the NeMo Gym runtime built every /run body and
    # mapped every answer with the "scripted" object; the plugin's runtime mapped with the "own" one. The
    # plugin's hookimpls and factory were not called again (not even past pluggy).
    assert counted == {
        "register_environments": 1,
        "register_runtimes": 1,
        "runtime factory": 1,
        "build_run_body": TRIALS,
        "map_result": 2 * TRIALS,
    }
