"""openair_congestion (NeMo Gym main) keeps one slot of a fixed pool per episode: its recordings cannot be
replayed (a scripted policy's), so its cleanup contract is proven here against its real resources server.
An episode is released by the rollout's cleanup (an aborted trial), by the step that ends it, and by the
/close its agent posts after a run; a seed for a rollout already cleaned up is refused."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from relax_gym_core.gym.processes import run_gym_servers
from relax_gym_core.testing import make_plugin_manager

from relax_gym_catalogue.upstream import read_server

pytestmark = pytest.mark.e2e

NAME = "openair_congestion"
NOOP = {  # a model turn calling its no-op tool
    "id": "resp",
    "created_at": 0,
    "model": "m",
    "object": "response",
    "parallel_tool_calls": False,
    "tool_choice": "auto",
    "tools": [],
    "output": [{"type": "function_call", "name": "noop", "arguments": "{}", "call_id": "c", "id": "fc"}],
}


@pytest.fixture(scope="module")
def server(require_installed: Callable[[str], None]) -> Iterator[str]:
    require_installed(NAME)
    resources = make_plugin_manager().environments.get(NAME).servers[0]
    assert resources.server_class == f"relax_gym_catalogue.servers:{NAME}"
    with run_gym_servers([resources], gateway_host="127.0.0.1", gateway_port=9) as running:  # no model
        yield running[resources.name].url


@pytest.fixture(scope="module")
def row(server: str) -> dict[str, Any]:  # after the server fixture: skipped with it where NeMo Gym lacks it
    first = read_server(NAME).example_rows()[0]
    return {key: value for key, value in first.items() if key != "agent_ref"}


def counts(client: httpx.Client, rollout_id: str) -> tuple[int, int, bool]:
    live = client.get("/relax_gym/sessions").json()
    return live["sessions"], live["rollouts"], client.get(f"/cleanup/{rollout_id}").json()["clean"]


def test_an_aborted_episode_is_released_by_its_rollouts_cleanup(server: str, row: dict[str, Any]) -> None:
    with httpx.Client(base_url=server, trust_env=False, timeout=30) as client:
        seed = {**row, "_ng_task_index": 7, "_ng_rollout_index": 0}
        assert client.post("/reset", json=seed).status_code == 200
        assert counts(client, "7-0") == (1, 1, False)
        assert client.post("/cleanup/7-0").json()["released_sessions"] == 1
        assert counts(client, "7-0") == (0, 0, True)
        assert client.post("/reset", json=seed).status_code == 409  # an abort that overtook its seed


def test_an_episode_is_released_by_the_step_that_ends_it_or_by_close(
    server: str, row: dict[str, Any]
) -> None:
    with httpx.Client(base_url=server, trust_env=False, timeout=30) as client:
        client.post("/reset", json={**row, "max_steps": 2, "_ng_task_index": 8, "_ng_rollout_index": 0})
        ended = [client.post("/step", json={**row, "response": NOOP}).json() for _ in range(2)]
        assert [step["terminated"] or step["truncated"] for step in ended] == [False, True]
        assert counts(client, "8-0") == (0, 0, True)
    with httpx.Client(base_url=server, trust_env=False, timeout=30) as client:  # a new session cookie
        client.post("/reset", json={**row, "_ng_task_index": 9, "_ng_rollout_index": 0})
        client.post("/step", json={**row, "response": NOOP})
        assert counts(client, "9-0") == (1, 1, False)
        assert client.post("/close", json={}).json()["already_closed"] is False  # what its agent posts
        assert counts(client, "9-0") == (0, 0, True)
