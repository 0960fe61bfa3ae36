"""What the calendar environment is: upstream's calendar resources server and simple_agent, under the
names Relax launch scripts use, with the limits of the relax-nemo-gym/v1 calendar recipe.

Stateless (no tools, no session: the grader reads the final message), so its cleanup contract is
STATELESS. One generation per trial: the agent makes exactly one model call.
"""

from __future__ import annotations

from relax_gym_core.environments import EnvironmentDefinition, NemoGymServer

ENVIRONMENT = "calendar"
CONFIGS = ("calendar-v1",)
RESOURCES_SERVER = "calendar"
AGENT = "calendar_simple_agent"
# The launcher puts upstream's directory on sys.path as NeMo Gym does (its app imports `utils`).
SERVER_CLASS = "resources_servers.calendar.app:CalendarResourcesServer"  # the installed class, unchanged

RESOURCES = NemoGymServer(
    name=RESOURCES_SERVER,
    kind="resources_servers",
    implementation="calendar",
    server_class=SERVER_CLASS,
    config={"domain": "agent"},
)

SIMPLE_AGENT = NemoGymServer(
    name=AGENT,
    kind="responses_api_agents",
    implementation="simple_agent",
    server_class="responses_api_agents.simple_agent.app:SimpleAgent",
    config={
        # One generation per trial. Upstream leaves max_steps unset (unlimited), and a reply with
        # neither a message nor a tool call (reasoning only) would then loop forever.
        "max_steps": 1,
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
        "NeMo Gym calendar: schedule every event of a long conversation under its constraints, answered "
        "as one JSON list and graded strictly 0/1 (stateless, one generation per trial, no tools)."
    ),
    max_deadline_s=1800.0,
    max_concurrency=8,
    queue_capacity=32,
)
