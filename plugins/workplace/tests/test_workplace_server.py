"""Against the REAL servers: our resources server subclass and upstream's simple_agent, started once per
test session in the NeMo Gym environment (the relax_gym_servers fixture). The agent's model server is a
stub that plays a scripted answer per test (no language model runs in tests)."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from attrs import define, field
from relax_gym_core.gym.release import observability_wanted
from relax_gym_core.ingym import released_in
from relax_gym_core.plugin import verify_body
from relax_gym_core.protocol import Generation
from relax_gym_core.testing import Hooks, check_probes, converted_row
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from relax_gym_workplace.plugin import AGENT, RESOURCES_SERVER, WORKPLACE
from relax_gym_workplace.probes import output_items
from relax_gym_workplace.rows import normalise_row

ENV = WORKPLACE.name
Script = Callable[[dict[str, Any]], list[dict[str, Any]]]


PREFIXED = "/ng-rollout/{rollout_id}/v1/responses"
pytestmark = pytest.mark.nemo_gym(ENV)  # the shared servers start in the background, while earlier tests run


@define
class StubModel:
    """The agent's policy_model: answers POST /v1/responses with the current test's script, also under
    NeMo Gym >= 0.5's per-rollout prefix (/ng-rollout/<id>/v1/responses, with observability on)."""

    script: Script | None = None
    requests: list[dict[str, Any]] = field(factory=list)
    prefixes: list[str | None] = field(factory=list)  # the rollout id of each call's prefix, if any

    async def responses(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        self.prefixes.append(request.path_params.get("rollout_id"))
        if self.script is None:
            return JSONResponse({"detail": "no script for this test"}, status_code=500)
        return JSONResponse(
            {
                "id": f"resp_{len(self.requests)}",
                "object": "response",
                "created_at": 0,
                "model": "stub",
                "output": self.script(body),
                "parallel_tool_calls": False,
                "tool_choice": "auto",
                "tools": [],
            }
        )


@define
class Stack:
    resources: str
    agent: str
    model: StubModel


@pytest.fixture(scope="module")
def stack(relax_gym_servers: Callable[..., Any]) -> Iterator[Stack]:
    servers = relax_gym_servers(ENV)
    model = StubModel()
    routes = [Route(path, model.responses, methods=["POST"]) for path in ("/v1/responses", PREFIXED)]
    app = Starlette(routes=routes)
    with servers.model.serving(app):  # the servers' policy_model answers with this module's stub
        yield Stack(servers.urls[RESOURCES_SERVER], servers.urls[AGENT], model)


@pytest.fixture(autouse=True)
def no_leftovers(stack: Stack) -> Iterator[None]:
    """Every test must leave as many live sessions as it found (none, unless an earlier test leaked)."""
    before = sessions(stack)
    stack.model.script = None
    stack.model.requests.clear()
    stack.model.prefixes.clear()
    yield
    assert sessions(stack) == before, "the test left sessions behind"


def client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, trust_env=False, timeout=120)


def sessions(stack: Stack) -> int:
    with client(stack.resources) as c:
        count: int = c.get("/relax_gym/sessions").raise_for_status().json()["sessions"]
        return count


def is_clean(stack: Stack, rollout_id: str) -> bool:
    with client(stack.resources) as c:
        answer = c.get(f"/cleanup/{rollout_id}").raise_for_status().json()
    assert answer["rollout_id"] == rollout_id
    clean: bool = answer["clean"]
    return clean


def new_rollout() -> str:
    return f"{uuid.uuid4().hex}-0"  # the gateway's shape: 128 random bits, rollout index 0


def run_body(row: dict[str, Any], rollout_id: str) -> dict[str, Any]:
    """What the agent forwards to /seed_session and /verify: the row plus the gateway's additions."""
    task_index, _, rollout_index = rollout_id.rpartition("-")
    body = {**copy.deepcopy(row), "_ng_task_index": task_index, "_ng_rollout_index": rollout_index}
    body["responses_create_params"]["metadata"] = {"relax_gym_rollout": rollout_id}
    return body


def calls_only(calls: list[dict[str, str]], tag: str) -> list[dict[str, Any]]:
    return [dict(item) for item in output_items(calls, tag)[:-1]]


def message_only(tag: str) -> list[dict[str, Any]]:
    return [dict(output_items([], tag)[-1])]


# ---- the verifier --------------------------------------------------------------------------------------


def test_every_probe_gets_its_expected_reward_from_the_real_verifier(stack: Stack, hooks: Hooks) -> None:
    def verify(row: dict[str, Any], output: list[dict[str, Any]]) -> float:
        with client(stack.resources) as c:
            answer = c.post("/verify", json=verify_body(row, output))
        assert answer.status_code == 200, answer.text
        reward: float = answer.json()["reward"]
        return reward

    probes = list(hooks.environments.get(ENV).verifier_probes())
    assert len(probes) == 25  # 5 kinds x 5 example rows: none silently dropped
    check_probes(hooks, ENV, verify)


def test_a_string_ground_truth_scores_doing_nothing_upstream(
    stack: Stack, rows: list[dict[str, Any]]
) -> None:
    """Why conversion parses ground_truth: upstream scores a do-nothing answer 1.0 against a string."""
    raw = copy.deepcopy(rows[0])
    raw["ground_truth"] = json.dumps(raw["ground_truth"])
    with client(stack.resources) as c:
        as_string = c.post("/verify", json=verify_body(raw, message_only("s"))).json()["reward"]
        normalised = c.post("/verify", json=verify_body(normalise_row(raw), message_only("n"))).json()
    assert as_string == 1.0
    assert normalised["reward"] == 0.0


# ---- cleanup by rollout id ---------------------------------------------------------------------------


def test_cleanup_releases_a_seeded_rollout(stack: Stack, rows: list[dict[str, Any]]) -> None:
    before = sessions(stack)
    rollout_id = new_rollout()
    with client(stack.resources) as c:
        assert c.post("/seed_session", json=run_body(rows[0], rollout_id)).status_code == 200
        assert sessions(stack) == before + 1
        assert is_clean(stack, rollout_id) is False
        search = c.post("/email_search_emails", json={"query": "Carlos"})  # the session's cookie
        assert search.status_code == 200
        assert "emails" in search.json()["output"]
        # POST /cleanup/{id} is ours, not a tool call swallowed by upstream's catch-all route
        assert c.post(f"/cleanup/{rollout_id}").json()["accepted"] is True
        assert is_clean(stack, rollout_id) is True
        assert sessions(stack) == before
        after = c.post("/email_search_emails", json={"query": "Carlos"})
        assert after.status_code == 400
        assert "Session not initialized" in after.text
        assert c.post(f"/cleanup/{rollout_id}").json()["accepted"] is True  # idempotent


def test_cleanup_releases_every_session_of_the_rollout_and_only_those(
    stack: Stack, rows: list[dict[str, Any]]
) -> None:
    before = sessions(stack)
    mine, other = new_rollout(), new_rollout()
    for rollout_id in (mine, mine, other):
        with client(stack.resources) as c:  # a fresh cookie jar: a new session each time
            assert c.post("/seed_session", json=run_body(rows[1], rollout_id)).status_code == 200
    assert sessions(stack) == before + 3
    with client(stack.resources) as c:
        assert c.post(f"/cleanup/{mine}").json()["dropped_sessions"] == 2
        assert (is_clean(stack, mine), is_clean(stack, other)) == (True, False)
        assert sessions(stack) == before + 1
        c.post(f"/cleanup/{other}").raise_for_status()


def test_verify_drops_the_session_of_its_cookie(stack: Stack, rows: list[dict[str, Any]]) -> None:
    before = sessions(stack)
    row = normalise_row(rows[0])
    with client(stack.resources) as c:
        assert c.post("/seed_session", json=row).status_code == 200  # plain NeMo Gym: no rollout id
        assert sessions(stack) == before + 1
        answer = c.post("/verify", json=verify_body(row, calls_only(row["ground_truth"], "v")))
        assert answer.json()["reward"] == 1.0
        assert sessions(stack) == before
        assert released_in(answer.json()) is None  # no rollout named: nothing to state


def test_verify_drops_the_sessions_of_its_rollout(stack: Stack, rows: list[dict[str, Any]]) -> None:
    rollout_id = new_rollout()
    body = run_body(normalise_row(rows[0]), rollout_id)
    with client(stack.resources) as c:
        assert c.post("/seed_session", json=body).status_code == 200
    assert is_clean(stack, rollout_id) is False
    with client(stack.resources) as c:  # no session cookie: found by the rollout id in the body
        answer = c.post("/verify", json=verify_body(body, message_only("r"))).json()
    assert answer["reward"] == 0.0
    assert is_clean(stack, rollout_id) is True
    assert released_in(answer) == rollout_id  # what the probe just said, said in the answer


def test_a_seed_after_cleanup_is_refused(stack: Stack, rows: list[dict[str, Any]]) -> None:
    before = sessions(stack)
    rollout_id = new_rollout()
    with client(stack.resources) as c:
        # The trial was aborted before its agent got to seed (the abort overtook the /run call).
        assert c.post(f"/cleanup/{rollout_id}").json()["accepted"] is True
        late = c.post("/seed_session", json=run_body(rows[0], rollout_id))
        assert late.status_code == 409
        assert "already cleaned up" in late.json()["detail"]
        assert sessions(stack) == before
        assert is_clean(stack, rollout_id) is True
    # Through the real agent: the refused seed fails the /run before the model is ever called.
    stack.model.script = lambda _body: message_only("late")
    with client(stack.agent) as c:
        assert c.post("/run", json=run_body(rows[0], rollout_id)).status_code == 500
    assert stack.model.requests == []


@pytest.mark.slow
def test_many_seed_and_verify_cycles_leave_no_session(stack: Stack, rows: list[dict[str, Any]]) -> None:
    row = normalise_row(rows[1])
    before = sessions(stack)
    with client(stack.resources) as c:
        for cycle in range(200):
            rollout_id = f"{cycle:032x}-0"
            body = run_body(row, rollout_id)
            assert c.post("/seed_session", json=body).status_code == 200
            assert c.post("/verify", json=verify_body(body, message_only(str(cycle)))).status_code == 200
    assert sessions(stack) == before == 0
    assert is_clean(stack, f"{199:032x}-0") is True


# ---- a whole /run through upstream's simple_agent ----------------------------------------------------


def test_a_run_through_the_real_agent_is_scored_and_leaves_nothing(
    stack: Stack, hooks: Hooks, rows: list[dict[str, Any]]
) -> None:
    row = rows[0]
    rollout_id = new_rollout()
    search = {"name": "email_search_emails", "arguments": json.dumps({"query": "Carlos Task Update"})}
    seen_clean: list[bool] = []

    def script(body: dict[str, Any]) -> list[dict[str, Any]]:
        outputs = [item for item in body["input"] if item.get("type") == "function_call_output"]
        if not outputs:
            seen_clean.append(is_clean(stack, rollout_id))  # mid-run: is the session under our id?
            return calls_only([search], "read")
        if len(outputs) == 1:
            return calls_only(row["ground_truth"], "write")
        return message_only("done")

    stack.model.script = script
    relax_row = converted_row(hooks.environments.get(ENV), copy.deepcopy(row))
    task = {"messages": relax_row["input"], "metadata": relax_row["metadata"]}
    body = hooks.environments.get(ENV).build_run_body(task, Generation(), rollout_id)
    body["responses_create_params"]["metadata"] = {"relax_gym_rollout": rollout_id}  # as the gateway does
    with client(stack.agent) as c:
        answer = c.post("/run", json=body)
    assert answer.status_code == 200, answer.text
    result = hooks.environments.get(ENV).map_result(answer.json())
    assert result.reward == 1.0
    assert result.metrics["turns"] == 3
    assert (result.metrics["tool_calls"], result.metrics["tool_outputs"]) == (2, 2)
    # The agent forwarded _ng_task_index/_ng_rollout_index to /seed_session: the session was keyed.
    assert seen_clean == [False]
    assert is_clean(stack, rollout_id) is True  # released by /verify, no cleanup call needed
    assert released_in(answer.json()) == rollout_id  # and said so: upstream's agent passes it on
    requests = stack.model.requests
    assert len(requests) == 3
    # NeMo Gym >= 0.5 with observability on prefixes each call by the rollout id the body carries.
    assert stack.model.prefixes == [rollout_id if observability_wanted(False) else None] * 3
    names = [tool["name"] for tool in requests[0]["tools"]]
    assert names == [tool["name"] for tool in row["responses_create_params"]["tools"]]
    tool_output = next(item for item in requests[1]["input"] if item.get("type") == "function_call_output")
    assert "00000057" in tool_output["output"]  # the real tool ran on the session's databases


def test_a_run_that_does_nothing_scores_zero(stack: Stack, hooks: Hooks, rows: list[dict[str, Any]]) -> None:
    rollout_id = new_rollout()
    stack.model.script = lambda _body: message_only("idle")
    relax_row = converted_row(hooks.environments.get(ENV), copy.deepcopy(rows[2]))
    body = hooks.environments.get(ENV).build_run_body(
        {"messages": relax_row["input"], "metadata": relax_row["metadata"]}, Generation(), rollout_id
    )
    with client(stack.agent) as c:
        answer = c.post("/run", json=body)
    assert answer.status_code == 200, answer.text
    result = hooks.environments.get(ENV).map_result(answer.json())
    assert (result.reward, result.metrics["turns"]) == (0.0, 1)
    assert is_clean(stack, rollout_id) is True
