"""What the reasoning_gym environment is here: upstream's reasoning_gym resources server, and the Claude
Code CLI per trial through our subclass of upstream's claude_code_agent (relax_gym_reasoning_gym_cc.agent).

The agent holds the trial's state (the CLI's process group, its config dir, workspace and tmp), so the
cleanup contract names the agent server: POST /cleanup/{rollout_id} kills and removes, GET answers
{"rollout_id", "clean"} after checking that no process and no directory of the trial is left.
"""

from __future__ import annotations

from relax_gym_core.plugin import CleanupContract, EnvironmentDefinition, NemoGymServer
from relax_gym_core.protocol import InterruptPolicy

from relax_gym_reasoning_gym_cc import claude
from relax_gym_reasoning_gym_cc.sandbox import UNSANDBOXED_ENV, unsandboxed_requested

ENVIRONMENT = "reasoning_gym"
CONFIGS = ("reasoning-gym-cc-v1",)
RESOURCES_SERVER = "reasoning_gym"
AGENT = "reasoning_gym_claude_code_agent_model_server"
AGENT_CLASS = "relax_gym_reasoning_gym_cc.agent:SandboxedClaudeCodeAgent"
RESOURCES_CLASS = "resources_servers.reasoning_gym.app:ReasoningGymResourcesServer"
CLEANUP_PATH = "/cleanup/{rollout_id}"  # POST kills and removes, GET answers {"rollout_id", "clean"}
TRIALS_PATH = "/relax_gym/trials"  # GET: live rollouts, their processes and directories
MAX_TURNS = 30  # the seed's REASONING_GYM_CC_MAX_TURNS
AGENT_TIMEOUT_S = 300  # the seed's REASONING_GYM_CC_AGENT_TIMEOUT
MAX_CONCURRENCY = 64  # the seed's REASONING_GYM_CC_MAX_CONCURRENCY
SYSTEM_PROMPT = (
    "You are a precise reasoning assistant. You have access to Bash to run Python for calculations.\n"
    "For every problem: think step by step, use Python via Bash to verify when helpful, and end with "
    "your final answer on its own line as <answer>...</answer>."
)

RESOURCES = NemoGymServer(
    name=RESOURCES_SERVER,
    kind="resources_servers",
    implementation="reasoning_gym",
    server_class=RESOURCES_CLASS,
    config={"domain": "knowledge"},
)

CLAUDE_CODE_AGENT = NemoGymServer(
    name=AGENT,
    kind="responses_api_agents",
    implementation="claude_code_agent",
    server_class=AGENT_CLASS,
    config={
        "resources_server": {"type": "resources_servers", "name": RESOURCES_SERVER},
        # The policy model is the gateway: the agent sends each trial's calls to its bridge prefix there.
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
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

DEFINITION = EnvironmentDefinition(
    name=ENVIRONMENT,
    configs=CONFIGS,
    agent=AGENT,
    servers=(RESOURCES, CLAUDE_CODE_AGENT),
    description=(
        "reasoning-gym tasks solved by the Claude Code CLI (one process group per trial, Bash in a "
        "bubblewrap sandbox, model calls through the trial's bridge as Anthropic Messages); reward from "
        "reasoning-gym's scorer of the final <answer>. "
        # What the agent will run, as found on this host (`relax-gym plugins` shows it): a file read.
        + claude.report()
        + (f"; UNSANDBOXED ({UNSANDBOXED_ENV}=1)" if unsandboxed_requested() else "")
    ),
    interrupt_policy=InterruptPolicy.PROTECTED,
    max_deadline_s=900.0,
    max_concurrency=MAX_CONCURRENCY,
    queue_capacity=4 * MAX_CONCURRENCY,
    readiness=(RESOURCES_SERVER, AGENT),
)

CLEANUP = CleanupContract.at(AGENT, CLEANUP_PATH)
