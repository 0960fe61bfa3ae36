"""The reasoning_gym environment (entry point ``reasoning_gym_cc``): upstream's reasoning_gym resources
server, and the Claude Code CLI per trial through our subclass of upstream's claude_code_agent
(relax_gym_reasoning_gym_cc.agent).

The agent holds the trial's state (the CLI's process group, its config dir, workspace and tmp), so the
cleanup contract names the agent server: POST /cleanup/{rollout_id} kills and removes, GET answers
{"rollout_id", "clean"} after checking that no process and no directory of the trial is left.

What differs from the reference: rows are checked and prompted (rows.py), probes come from the bundled
example rows (probes.py), and a result carries reasoning-gym's own figures and is never a fake zero.
claude_code_agent's /run answers upstream's reasoning_gym verify response (the row, the ``response`` it
scored, ``reward`` = ``score``, ``task_name``, ``extracted_answer``) plus ``turns_used`` and
``finished_naturally``. A /run answer without a response and a numeric reward means nothing was scored:
``reference.verified_answer`` raises ``EnvironmentFailure(kind="verifier_error")`` (Relax drops the group),
never a reward of 0. Neither is an empty output: the CLI then produced nothing at all (it failed or was
killed), and upstream would score the empty text 0.0 as if the model had answered wrongly
(``kind="agent_error"``). A run that ended without a final assistant message (max turns, time limit) keeps
its score but is ``truncated``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from relax_gym_core.ingym import CLEANUP_PATH
from relax_gym_core.plugin import (
    POLICY_MODEL,
    CleanupContract,
    EnvironmentDefinition,
    EnvironmentFailure,
    EnvironmentRegistrar,
    NemoGymServer,
    RunResult,
    VerifierProbe,
    hookimpl,
    reference,
    resources_server,
)
from relax_gym_core.protocol import Generation, InterruptPolicy, TrialStatus

from relax_gym_reasoning_gym_cc import claude, probes, rows
from relax_gym_reasoning_gym_cc.sandbox import UNSANDBOXED_ENV, unsandboxed_requested

RESOURCES_SERVER = "reasoning_gym"
AGENT = "reasoning_gym_claude_code_agent_model_server"
AGENT_CLASS = "relax_gym_reasoning_gym_cc.agent:SandboxedClaudeCodeAgent"
RESOURCES_CLASS = "resources_servers.reasoning_gym.app:ReasoningGymResourcesServer"
MAX_TURNS = 30  # the seed's REASONING_GYM_CC_MAX_TURNS
AGENT_TIMEOUT_S = 300  # the seed's REASONING_GYM_CC_AGENT_TIMEOUT
MAX_CONCURRENCY = 64  # the seed's REASONING_GYM_CC_MAX_CONCURRENCY
SYSTEM_PROMPT = (
    "You are a precise reasoning assistant. You have access to Bash to run Python for calculations.\n"
    "For every problem: think step by step, use Python via Bash to verify when helpful, and end with "
    "your final answer on its own line as <answer>...</answer>."
)
AGENT_ERROR = "agent_error"

CLAUDE_CODE_AGENT = NemoGymServer(  # not a simple_agent: upstream's claude_code_agent, our subclass of it
    name=AGENT,
    kind="responses_api_agents",
    implementation="claude_code_agent",
    server_class=AGENT_CLASS,
    config={
        "resources_server": {"type": "resources_servers", "name": RESOURCES_SERVER},
        # The policy model is the gateway: the agent sends each trial's calls to its bridge prefix there.
        "model_server": {"type": "responses_api_models", "name": POLICY_MODEL},
        "concurrency": MAX_CONCURRENCY,
        # Replaced per trial: the CLI sends whatever model the trial's model route names.
        "model": "claude-sonnet-4-5",
        "anthropic_api_key": "EMPTY",  # pragma: allowlist secret - the trial's token replaces it
        "max_turns": MAX_TURNS,
        "timeout": AGENT_TIMEOUT_S,
        "thinking": "disabled",
        "bare": True,
        "system_prompt": SYSTEM_PROMPT,
    },
)


def figures(body: dict[str, Any], status: TrialStatus) -> dict[str, Any]:
    """reasoning-gym's own figures of a verified /run answer, beside the reference metrics."""
    metrics: dict[str, Any] = {}
    if isinstance(body.get("task_name"), str):
        metrics["task_name"] = body["task_name"]
    if isinstance(body.get("turns_used"), int) and not isinstance(body["turns_used"], bool):
        metrics["turns_used"] = body["turns_used"]
    extracted = body.get("extracted_answer")
    metrics["answer_extracted"] = isinstance(extracted, str) and bool(extracted)
    metrics["finished_naturally"] = status is not TrialStatus.TRUNCATED
    return metrics


class ReasoningGym(EnvironmentDefinition):
    def convert_row(self, row: dict[str, Any]) -> dict[str, Any]:
        return rows.convert_row(row)

    def drop_reason(self, row: dict[str, Any]) -> str | None:
        return rows.drop_reason(row)

    def build_run_body(self, task: dict[str, Any], generation: Generation, rollout_id: str) -> dict[str, Any]:
        return rows.build_run_body(task, generation, rollout_id)

    def map_result(self, body: dict[str, Any]) -> RunResult:
        output, _reward = reference.verified_answer(self.name, body)
        if not output:
            raise EnvironmentFailure(
                f"{self.name} /run answer has an empty output: the Claude Code CLI produced nothing, so its "
                "score is not the model's",
                kind=AGENT_ERROR,
            )
        if body.get("finished_naturally") is False:  # no final assistant message: stopped, not done
            body = {**body, "truncated": True}
        result = reference.map_result(body)
        return result.with_metrics(figures(body, result.status))

    def verifier_probes(self) -> Sequence[VerifierProbe]:
        return probes.verifier_probes()


REASONING_GYM = ReasoningGym(
    name="reasoning_gym",
    configs=("reasoning-gym-cc-v1",),
    agent=AGENT,
    servers=(
        resources_server(RESOURCES_SERVER, "reasoning_gym", RESOURCES_CLASS, domain="knowledge"),
        CLAUDE_CODE_AGENT,
    ),
    # The agent holds each trial's CLI process group and directories: cleanup is proven by rollout id.
    cleanup=CleanupContract.at(AGENT, CLEANUP_PATH),
    description=(
        "reasoning-gym tasks solved by the Claude Code CLI (one process group per trial, Bash in a "
        "bubblewrap sandbox, model calls through the trial's bridge as Anthropic Messages); reward from "
        "reasoning-gym's scorer of the final <answer>. "
        # What the agent will run, as found on this host (`relax-gym plugins` shows it): a file read.
        + claude.report()
        + (f"; UNSANDBOXED ({UNSANDBOXED_ENV}=1)" if unsandboxed_requested() else "")
    ),
    needs=("the Claude Code CLI (make gym installs it)", "unprivileged user namespaces for bubblewrap"),
    model_api="messages",  # the CLI speaks Anthropic Messages
    agent_tools=True,  # and offers the model its own tools (Bash, ...) in every call
    interrupt_policy=InterruptPolicy.PROTECTED,
    max_deadline_s=900.0,
    max_concurrency=MAX_CONCURRENCY,
    queue_capacity=4 * MAX_CONCURRENCY,
    readiness=(RESOURCES_SERVER, AGENT),
)


@hookimpl
def register_environments(registrar: EnvironmentRegistrar) -> None:
    registrar.add(REASONING_GYM)
