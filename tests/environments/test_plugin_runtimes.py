"""Plugins under `relax-gym serve`: the installed plugins shape runs exactly as under `relax-gym up`, and a
plugin can bring its own runtime (register_runtimes) for environments that do not run behind NeMo Gym."""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from relax_gym_core.errors import PluginError
from relax_gym_core.plugin import EnvironmentDefinition, hookimpl
from relax_gym_core.plugin.host import make_plugin_manager
from relax_gym_core.plugin.manager import DISABLE_VAR
from relax_gym_core.testing import ConformanceError, check_registration
from relax_gym_core.testing.web import serve_in_thread, start_gateway

# A plugin whose result mapping refuses a /run answer without a reward (an infrastructure failure, never a
# reward), and which brings a runtime of its own for an environment with no NeMo Gym servers.
PLUGIN = """
from relax_gym_core.plugin import (
    STATELESS, EnvironmentDefinition, EnvironmentFailure, NemoGymServer, RunResult, hookimpl,
)
from relax_gym_core.runtimes import CLEANUP_CONFIRMED


class Mapped(EnvironmentDefinition):
    def map_result(self, body):
        if "reward" not in body:
            raise EnvironmentFailure("the /run answer carries no reward", kind="verifier_error")
        return RunResult(reward=body["reward"])


@hookimpl
def register_environments(registrar):
    agent = NemoGymServer(
        name="agent", kind="responses_api_agents", implementation="simple_agent", server_class="m:C"
    )
    registrar.add(Mapped(name="mapped", configs=("c",), agent="agent", servers=(agent,), cleanup=STATELESS))
    registrar.add(
        EnvironmentDefinition(
            name="own", configs=("c",), agent="local", servers=(), cleanup=STATELESS, runtime="counting"
        )
    )


class Run:
    placement = None

    def __init__(self, runtime, context):
        self.runtime, self.context = runtime, context

    async def wait(self):
        self.runtime.runs += 1
        environment = self.runtime.environment.name  # the object the factory was given
        return RunResult(
            reward=0.25, metrics={"run_by": "counting", "environment": environment, "runs": self.runtime.runs}
        )

    async def abort(self):
        return CLEANUP_CONFIRMED

    async def force_cleanup(self):
        return CLEANUP_CONFIRMED

    async def probe_cleanup(self):
        return CLEANUP_CONFIRMED


class CountingRuntime:
    def __init__(self, spec, environment):
        self.spec, self.environment, self.runs = spec, environment, 0

    async def start(self, context):
        return Run(self, context)

    def handle_for(self, rollout_id, placement=None):
        return Run(self, None)

    async def ready(self):
        return True

    async def close(self):
        return None


@hookimpl
def register_runtimes(registrar):
    registrar.add("counting", CountingRuntime)  # called as factory(spec, environment object)
"""


@pytest.fixture
def empty_agent() -> Iterator[str]:
    """A NeMo Gym agent stand-in whose /run answers {} (what a crashed verifier chain can return)."""

    async def run(_request: Request) -> JSONResponse:
        return JSONResponse({})

    with serve_in_thread(Starlette(routes=[Route("/run", run, methods=["POST"])])) as server:
        yield server.url


def settled(url: str, request_id: str) -> dict[str, Any]:
    stop = time.monotonic() + 60  # a safety net only: the trial settles in well under a second
    while True:
        snapshot: dict[str, Any] = httpx.get(f"{url}/v1/trials/{request_id}").json()
        if snapshot["cleanup"] != "pending" or time.monotonic() > stop:
            return snapshot
        time.sleep(0.02)


def test_serve_runs_plugin_environments_with_their_methods_and_runtimes(
    install_dist: Callable[..., Any],
    isolated_env: list[str],
    empty_agent: str,
    make_body: Callable[..., dict[str, Any]],
) -> None:
    dist = install_dist(
        distribution="relax-gym-fake-runtime",
        entry_points={"fake": "{pkg}.plugin"},
        modules={"plugin": PLUGIN},
    )
    specs = {
        "c": {"environment": "mapped", "agent_name": "agent", "agent_url": empty_agent, "stateless": True},
        "own": {"environment": "own", "runtime": "counting"},
    }
    env = {"PYTHONPATH": str(dist.site), DISABLE_VAR: ",".join(isolated_env)}
    with start_gateway(specs, env=env) as gateway:
        mapped = make_body(env="mapped", config="c")
        own = make_body(env="own", config="own")
        for body in (mapped, own):
            assert httpx.post(f"{gateway.url}/v1/trials", json=body).status_code == 202
        failed = settled(gateway.url, mapped["request_id"])
        completed = settled(gateway.url, own["request_id"])
    # The environment's map_result ran: an answer without a reward is an infrastructure failure, not a score.
    assert failed["status"] == "failed"
    assert failed["reward"] is None
    assert failed["error"] == {"code": "agent_error", "kind": "verifier_error"}
    # The plugin's runtime ran the other environment, built with that environment's object.
    assert completed["status"] == "completed"
    assert completed["reward"] == 0.25
    assert completed["metrics"] == {"run_by": "counting", "environment": "own", "runs": 1}
    assert completed["cleanup"] == "confirmed"


def test_without_the_plugin_its_runtime_is_a_clear_startup_error(
    install_dist: Callable[..., Any], isolated_env: list[str], empty_agent: str
) -> None:
    dist = install_dist(
        distribution="relax-gym-fake-runtime",
        entry_points={"fake": "{pkg}.plugin"},
        modules={"plugin": PLUGIN},
    )
    env = {"PYTHONPATH": str(dist.site), DISABLE_VAR: ",".join([*isolated_env, "fake"])}
    specs = {"own": {"environment": "own", "runtime": "counting"}}
    with (
        pytest.raises(RuntimeError, match="runtime 'counting' is not available"),
        start_gateway(specs, env=env),
    ):
        pass


def in_process_plugin(**hooks: Any) -> types.ModuleType:
    """A plugin registered in-process: a module holding its hookimpls (pluggy keeps plugins in sets, so a
    plugin is hashable; a SimpleNamespace is not)."""
    plugin = types.ModuleType("in_process_plugin")
    vars(plugin).update(hooks)
    return plugin


def _runtime_plugin(name: str) -> types.ModuleType:
    @hookimpl
    def register_runtimes(registrar: Any) -> None:
        registrar.add(name, lambda spec, environment: None)

    return in_process_plugin(register_runtimes=register_runtimes)


def test_runtime_names_are_unique_and_built_ins_are_reserved() -> None:
    hooks = make_plugin_manager(
        load_entry_points=False, plugins=[("one", _runtime_plugin("x")), ("two", _runtime_plugin("x"))]
    )
    with pytest.raises(PluginError, match="runtime 'x' is registered by both plugin 'one' and plugin 'two'"):
        _ = hooks.runtimes
    from relax_gym_core.runtimes.builtin import runtime_factories  # noqa: PLC0415

    taken = make_plugin_manager(load_entry_points=False, plugins=[("one", _runtime_plugin("echo"))])
    with pytest.raises(PluginError, match="runtime 'echo' is built in"):
        runtime_factories(taken)


def test_the_conformance_kit_accepts_an_environment_with_its_own_runtime(install_dist: Any) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(PLUGIN, "fake_plugin", "exec"), namespace)
    plugin = in_process_plugin(**{k: v for k, v in namespace.items() if k.startswith("register_")})
    hooks = make_plugin_manager(load_entry_points=False, plugins=[("fake", plugin)])
    definition: EnvironmentDefinition = check_registration(hooks, "own", installed=False)
    assert definition.servers == ()

    unregistered = in_process_plugin(
        **{k: v for k, v in vars(plugin).items() if k.startswith("register_") and k != "register_runtimes"}
    )
    bare = make_plugin_manager(load_entry_points=False, plugins=[("fake", unregistered)])
    with pytest.raises(ConformanceError, match="runtime 'counting' is not registered"):
        check_registration(bare, "own", installed=False)
