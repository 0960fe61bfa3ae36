"""What the workplace_assistant environment is: its NeMo Gym servers, limits and cleanup contract.

The resources server is the installed upstream ``WorkbenchResourcesServer`` extended (subclass, in
relax_gym_workplace.server) so that a trial's tool databases are released when it ends and the release
can be confirmed by rollout id. The agent is the installed upstream ``simple_agent``, unchanged.
"""

from __future__ import annotations

from relax_gym_core.plugin import CleanupContract, EnvironmentDefinition, NemoGymServer
from relax_gym_core.protocol import InterruptPolicy

ENVIRONMENT = "workplace_assistant"
CONFIGS = ("workplace-assistant-v1",)
RESOURCES_SERVER = "workplace_assistant"
AGENT = "workplace_assistant_simple_agent"
SERVER_CLASS = "relax_gym_workplace.server:CleanupWorkbenchResourcesServer"
CLEANUP_PATH = "/cleanup/{rollout_id}"  # POST releases, GET answers {"rollout_id", "clean"}
SESSIONS_PATH = "/relax_gym/sessions"  # GET {"sessions": live tool environments}, for leak checks

RESOURCES = NemoGymServer(
    name=RESOURCES_SERVER,
    kind="resources_servers",
    implementation="workplace_assistant",
    server_class=SERVER_CLASS,
    config={"domain": "agent"},
)

SIMPLE_AGENT = NemoGymServer(
    name=AGENT,
    kind="responses_api_agents",
    implementation="simple_agent",
    server_class="responses_api_agents.simple_agent.app:SimpleAgent",
    config={
        # upstream's workplace_assistant.yaml: tasks need a few tool rounds, never an unbounded loop
        "max_steps": 6,
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
        "NeMo Gym workplace_assistant: multi-step office tool use (email, calendar, analytics, project "
        "management, CRM) scored by replaying the calls and comparing final database state."
    ),
    interrupt_policy=InterruptPolicy.PROTECTED,
    max_deadline_s=1800.0,
    max_concurrency=8,
    queue_capacity=32,
    readiness=(RESOURCES_SERVER, AGENT),
)

CLEANUP = CleanupContract.at(RESOURCES_SERVER, CLEANUP_PATH)
