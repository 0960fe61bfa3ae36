"""The NeMo Gym servers an environment needs, and constructors for the usual ones.

A NemoGymServer is one top-level key of the merged NeMo Gym config. Its `server_class` ("module:Class")
is imported inside the NeMo Gym environment, never by the core: the installed upstream class, or a
plugin's subclass of it. `config` holds the instance's own fields from upstream's YAML (the keys under
``<name>.<kind>.<implementation>``: max_steps, references to other servers, domain...); `entrypoint`,
`host` and `port` are the launcher's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, get_args

from attrs import field, frozen

type ServerKind = Literal["resources_servers", "responses_api_agents", "responses_api_models"]

SERVER_KINDS: Final = frozenset(get_args(ServerKind.__value__))
POLICY_MODEL: Final = "policy_model"  # the model server NeMo Gym agents call; relax-gym's gateway plays it
SIMPLE_AGENT_CLASS: Final = "responses_api_agents.simple_agent.app:SimpleAgent"


@frozen(kw_only=True)
class NemoGymServer:
    """One NeMo Gym server instance an environment needs (a top-level key of the merged config)."""

    name: str
    kind: ServerKind
    implementation: str  # the upstream directory, e.g. "simple_agent"
    server_class: str
    config: Mapping[str, Any] = field(factory=dict)


def resources_server(name: str, implementation: str, server_class: str, **config: Any) -> NemoGymServer:
    """A resources server: upstream's `implementation` directory, run as `server_class` (upstream's
    class, e.g. ``resources_servers.calendar.app:CalendarResourcesServer``, or a plugin's subclass)."""
    return NemoGymServer(
        name=name,
        kind="resources_servers",
        implementation=implementation,
        server_class=server_class,
        config=config,
    )


def agent_server(
    name: str, implementation: str, server_class: str, *, resources: str, **config: Any
) -> NemoGymServer:
    """An agent (a responses_api_agents server: its POST /run runs one trial) wired as relax-gym runs it:
    its resources server `resources`, its model the policy model (the gateway, so every model call is
    bridged to the trial's session). E.g. upstream's claude_code_agent, or a plugin's subclass of it."""
    return NemoGymServer(
        name=name,
        kind="responses_api_agents",
        implementation=implementation,
        server_class=server_class,
        config={
            "resources_server": {"type": "resources_servers", "name": resources},
            "model_server": {"type": "responses_api_models", "name": POLICY_MODEL},
            **config,
        },
    )


def simple_agent(
    name: str,
    *,
    resources: str,
    max_steps: int | None = None,
    server_class: str = SIMPLE_AGENT_CLASS,
    **config: Any,
) -> NemoGymServer:
    """NeMo Gym's simple_agent as an agent_server. `max_steps` bounds the model calls of one trial (None:
    upstream's default, unlimited: a reply with neither a message nor a tool call would then loop until
    the deadline)."""
    steps = {} if max_steps is None else {"max_steps": max_steps}
    return agent_server(name, "simple_agent", server_class, resources=resources, **steps, **config)
