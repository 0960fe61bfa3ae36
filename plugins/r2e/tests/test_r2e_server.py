"""The real r2e_gym resources server (inside the NeMo Gym environment, from the session's shared
`relax-gym up r2e_gym`): the verifier contract (the conformance kit's check_probes), and cleanup by rollout
id, checked on the machine (no sandbox process of the server's uids, no directory): a rollout aborted
while a command runs or while its patch is evaluated, seeds and tools that arrive after the abort."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from relax_gym_core.plugin import (
    EnvironmentRegistrar,
    VerifierProbe,
    hookimpl,
    verify_body,
)
from relax_gym_core.testing import check_probes, plugin_hooks

from relax_gym_r2e.plugin import R2E_GYM, R2EGym
from relax_gym_r2e.sandbox import processes_of

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.nemo_gym("r2e_gym")]

ENV = "r2e_gym"
_ids = itertools.count()


@pytest.fixture(scope="module")
def server(relax_gym_up: Callable[..., Any]) -> str:
    """The r2e_gym resources server of the shared `relax-gym up` (from the lines it printed)."""
    gateway = relax_gym_up(ENV)
    for line in gateway.output:
        match = re.match(r"NeMo Gym server r2e_gym at (\S+)", line)
        if match:
            return match.group(1)
    raise AssertionError("resources server address not printed:\n" + "\n".join(gateway.output))


def sandboxes(url: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/relax_gym/sandboxes", timeout=30, trust_env=False)
    answer.raise_for_status()
    body: dict[str, Any] = answer.json()
    return body


def left_on_machine(url: str) -> tuple[int, int, int]:
    """(live rollouts, sandbox processes of the server's uids, run directories), read from the machine."""
    state = sandboxes(url)
    first, end = state["uid_range"]
    root = Path(state["state_dir"])
    directories = [path for name in ("rollouts", "evaluations") for path in (root / name).iterdir()]
    return state["rollouts"], len(processes_of(set(range(first, end)))), len(directories)


def rollout_row(row: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    task, rollout = f"server-test-{next(_ids)}", "0"
    return f"{task}-{rollout}", {**row, "_ng_task_index": task, "_ng_rollout_index": rollout}


class TwoTasks(R2EGym):
    """r2e_gym with the probes of two bundled tasks only: `relax-gym probe` (test_r2e_probe_cli) scores all
    of them."""

    def verifier_probes(self) -> list[VerifierProbe]:
        return [
            probe for probe in super().verifier_probes() if probe.name.split(":")[0] in ("acl", "durations")
        ]


class TwoTasksPlugin:
    @hookimpl
    def register_environments(self, registrar: EnvironmentRegistrar) -> None:
        registrar.add(TwoTasks(**attrs.asdict(R2E_GYM, recurse=False)))


def test_probes_are_scored_as_they_claim_by_the_real_verifier(server: str) -> None:
    hooks = plugin_hooks("two", TwoTasksPlugin())

    def verify(row: dict[str, Any], output: list[dict[str, Any]]) -> float:
        answer = httpx.post(f"{server}/verify", json=verify_body(row, output), timeout=120, trust_env=False)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["replayed"] is True  # no workspace: the trajectory's tool calls were replayed
        return float(body["reward"])

    check_probes(hooks, ENV, verify)
    assert len(list(hooks.environments.get(ENV).verifier_probes())) == 6
    assert left_on_machine(server) == (0, 0, 0)


def test_seeds_naming_no_bundled_task_are_refused_naming_the_field(
    server: str, rows: list[dict[str, Any]]
) -> None:
    with httpx.Client(base_url=server, timeout=60, trust_env=False) as client:
        unknown = client.post("/seed_session", json=dict(rows[0], repo_name="leftpad"))
        stale = client.post("/seed_session", json=dict(rows[0], base_commit="0" * 40))
    assert (
        unknown.status_code == 422 and "row field repo_name 'leftpad' is not a bundled task" in unknown.text
    )
    assert stale.status_code == 422 and "row field base_commit" in stale.text


async def test_an_abort_during_a_command_kills_it_and_leaves_nothing(
    server: str, rows: list[dict[str, Any]]
) -> None:
    rollout_id, row = rollout_row(rows[1])
    async with httpx.AsyncClient(base_url=server, timeout=120, trust_env=False) as agent:
        assert (await agent.post("/seed_session", json=row)).status_code == 200
        command = asyncio.ensure_future(agent.post("/bash", json={"command": "sleep 200", "timeout": 250}))
        async with httpx.AsyncClient(base_url=server, timeout=60, trust_env=False) as gateway:
            async with asyncio.timeout(60):  # against hangs only
                while True:  # until the sleep runs in the rollout's sandbox
                    if (await gateway.get("/relax_gym/sandboxes")).json()["running"]:
                        break
                    await asyncio.sleep(0.05)
            aborted = (await gateway.post(f"/cleanup/{rollout_id}")).json()
            probed = (await gateway.get(f"/cleanup/{rollout_id}")).json()
        killed = await command  # returns at once: killed, not after its 200 s
        late_tool = await agent.post("/bash", json={"command": "true"})
        late_verify = await agent.post("/verify", json=verify_body(row, []))
        late_seed = await agent.post("/seed_session", json=row)
    assert aborted == {"accepted": True, "rollout_id": rollout_id, "clean": True}
    assert probed == {"rollout_id": rollout_id, "clean": True}
    assert killed.status_code == 200 and "[timed out" not in killed.text
    assert late_tool.status_code == 409
    assert late_verify.status_code == 409 and "has no workspace" in late_verify.text
    assert late_seed.status_code == 409 and "already cleaned up" in late_seed.text
    assert left_on_machine(server) == (0, 0, 0)


def test_a_verified_rollout_is_gone_before_verify_answers(server: str, rows: list[dict[str, Any]]) -> None:
    rollout_id, row = rollout_row(rows[2])
    with httpx.Client(base_url=server, timeout=120, trust_env=False) as agent:
        assert agent.post("/seed_session", json=row).status_code == 200
        assert left_on_machine(server)[0] == 1 and left_on_machine(server)[2] == 1
        listing = agent.post("/view", json={"path": "."})
        verdict = agent.post("/verify", json=verify_body(row, [])).json()
        again = agent.post("/verify", json=verify_body(row, []))
        probed = httpx.get(f"{server}/cleanup/{rollout_id}", trust_env=False).json()
    assert listing.status_code == 200 and listing.text.startswith("/workspace/repo/")
    assert (verdict["reward"], verdict["resolved"], verdict["patch_exists"], verdict["replayed"]) == (
        0.0,
        False,
        False,
        False,
    )
    assert verdict["commands"] == 1
    assert again.status_code == 409
    assert probed["clean"] is True
    assert left_on_machine(server) == (0, 0, 0)


async def test_a_cleanup_during_the_evaluation_ends_it(server: str, rows: list[dict[str, Any]]) -> None:
    """A patch whose tests never end, and the trial aborted while they run: the evaluation's sandbox is
    killed and its checkout removed, and verify answers 409 instead of a reward."""
    rollout_id, row = rollout_row(next(row for row in rows if row["repo_name"] == "pager"))
    hang = {"path": "pager/core.py", "old_str": "return total // per_page", "new_str": "while True: pass"}
    async with httpx.AsyncClient(base_url=server, timeout=120, trust_env=False) as agent:
        assert (await agent.post("/seed_session", json=row)).status_code == 200
        assert (await agent.post("/str_replace", json=hang)).text.startswith("Replaced 1 occurrence")
        verify = asyncio.ensure_future(agent.post("/verify", json=verify_body(row, [])))
        async with httpx.AsyncClient(base_url=server, timeout=60, trust_env=False) as gateway:
            async with asyncio.timeout(60):  # against hangs only
                while True:  # until the hidden tests spin in the evaluation's sandbox
                    state = (await gateway.get("/relax_gym/sandboxes")).json()
                    if state["evaluating"] and state["sandbox_processes"]:
                        break
                    await asyncio.sleep(0.05)
            aborted = (await gateway.post(f"/cleanup/{rollout_id}")).json()
        verdict = await verify
    assert aborted["clean"] is True
    assert verdict.status_code == 409 and "cleaned up while its patch was evaluated" in verdict.text
    assert left_on_machine(server) == (0, 0, 0)
