"""What the r2e_gym environment is here (the local runtime): our resources server, simple_agent, limits.

The resources server is ours (relax_gym_r2e.server, on NeMo Gym's SimpleResourcesServer): bash / view /
str_replace act on a per-rollout checkout inside a bubblewrap sandbox, /verify runs the hidden tests. The
agent is NeMo Gym's unchanged simple_agent. Production runs the same environment and config behind
NeMo Gym's swe_agents with Apptainer instead (relax_gym_r2e.production); that is configuration only here.
"""

from __future__ import annotations

from relax_gym_core.plugin import CleanupContract, EnvironmentDefinition, NemoGymServer
from relax_gym_core.protocol import InterruptPolicy

ENVIRONMENT = "r2e_gym"
CONFIGS = ("r2e-gym-v1",)
RESOURCES_SERVER = "r2e_gym"
AGENT = "r2e_gym_simple_agent"
SERVER_CLASS = "relax_gym_r2e.server:R2EResourcesServer"
CLEANUP_PATH = "/cleanup/{rollout_id}"  # POST releases, GET answers {"rollout_id", "clean"}
SANDBOXES_PATH = "/relax_gym/sandboxes"  # GET: live rollouts, sandbox processes, directories
MAX_STEPS = 30  # model turns per trial (R2E's local default: 30 agent turns)
COMMAND_TIMEOUT_S = 30.0
MAX_COMMAND_TIMEOUT_S = 300.0
TESTS_TIMEOUT_S = 120.0

RESOURCES = NemoGymServer(
    name=RESOURCES_SERVER,
    kind="resources_servers",
    implementation="r2e_gym",
    server_class=SERVER_CLASS,
    config={
        "domain": "coding",
        "command_timeout_s": COMMAND_TIMEOUT_S,
        "max_command_timeout_s": MAX_COMMAND_TIMEOUT_S,
        "tests_timeout_s": TESTS_TIMEOUT_S,
        "max_processes": 64,
        "max_memory_mb": 1024,
    },
)

SIMPLE_AGENT = NemoGymServer(
    name=AGENT,
    kind="responses_api_agents",
    implementation="simple_agent",
    server_class="responses_api_agents.simple_agent.app:SimpleAgent",
    config={
        "max_steps": MAX_STEPS,
        "resources_server": {"type": "resources_servers", "name": RESOURCES_SERVER},
        "model_server": {"type": "responses_api_models", "name": "policy_model"},
    },
)

DEFINITION = EnvironmentDefinition(
    name=ENVIRONMENT,
    configs=CONFIGS,
    agent=AGENT,
    servers=(RESOURCES, SIMPLE_AGENT),
    description=(
        "R2E-Gym style repository repair: fix a bug in a small git repository with bash / view / "
        "str_replace in a bubblewrap sandbox; reward 1.0 when the hidden tests pass, 0.1 for a patch "
        "that does not, 0.0 for none."
    ),
    interrupt_policy=InterruptPolicy.PROTECTED,
    max_deadline_s=7200.0,
    max_concurrency=8,
    queue_capacity=16,
    readiness=(RESOURCES_SERVER, AGENT),
)

CLEANUP = CleanupContract.at(RESOURCES_SERVER, CLEANUP_PATH)
