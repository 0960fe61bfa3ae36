"""`relax-gym relax-args ENV... [--gateway URL] [--deadline-s S] [--check "<relax command line>"]`: the flags
that make Relax run these environments' trials through the thin client, and what is wrong in a given one.

What a flag needs comes from the environments themselves: their configs (NEMO_GYM_CONFIG when there is one),
whether their model calls carry tools (rows with tools, or an agent with tools of its own: then Relax needs
a tool-call parser, which it runs only for requests with tools), and which of Relax's per-session routes
their agents call (EnvironmentDefinition.model_api). Relax's own rules are from its argument checks:
`--agent-env` takes every pair in one occurrence (a second one drops the first) and refuses RELAX_* keys.
"""

from __future__ import annotations

import shlex
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from attrs import frozen

from relax_gym_core.client.settings import DEFAULT_DEADLINE_S, DEFAULT_LEASE_S
from relax_gym_core.errors import ConfigError
from relax_gym_core.plugin import EnvironmentDefinition
from relax_gym_core.plugin.host import make_plugin_manager

CLIENT = "relax-gym-client"
# --agent-timeout above the deadline by this much: the client's start, its create and the last poll after the
# gateway ends the trial at its deadline, so the client (not Relax's kill) reports how the trial ended.
CLIENT_MARGIN_S = 60.0
RELAX_AGENT_TIMEOUT_S = 1800.0  # Relax's --agent-timeout when not given
ROUTES = {
    "responses": "/v1/responses",
    "chat/completions": "/v1/chat/completions",
    "messages": "/v1/messages",
}


@frozen(kw_only=True)
class Needs:
    """What Relax must be given for these environments."""

    environments: tuple[str, ...]
    config: str | None  # NEMO_GYM_CONFIG: the one config of the one environment, else rows carry theirs
    tools: bool
    routes: tuple[str, ...]

    @classmethod
    def of(cls, definitions: Sequence[EnvironmentDefinition]) -> Needs:
        only = definitions[0] if len(definitions) == 1 else None
        return cls(
            environments=tuple(d.name for d in definitions),
            config=only.configs[0] if only is not None and len(only.configs) == 1 else None,
            tools=any(d.agent_tools or _rows_carry_tools(d) for d in definitions),
            routes=tuple(sorted({ROUTES[d.model_api] for d in definitions})),
        )


def _rows_carry_tools(definition: EnvironmentDefinition) -> bool:
    """Whether its rows offer the model tools (its probes are real rows of it)."""
    return any(
        (probe.row.get("responses_create_params") or {}).get("tools")
        for probe in definition.verifier_probes()
    )


def _definitions(names: Sequence[str]) -> list[EnvironmentDefinition]:
    registry = make_plugin_manager().environments
    return [
        registry.get(name) for name in dict.fromkeys(names)
    ]  # UnknownEnvironmentError names the installed


def agent_env(needs: Needs, gateway: str, deadline_s: float) -> dict[str, str]:
    env = {"NEMO_GYM_URL": gateway}
    if len(needs.environments) == 1:
        env["NEMO_GYM_ENVIRONMENT"] = needs.environments[0]
    if needs.config is not None:
        env["NEMO_GYM_CONFIG"] = needs.config
    env["NEMO_GYM_DEADLINE_S"] = _number(deadline_s)
    env["NEMO_GYM_LEASE_S"] = _number(DEFAULT_LEASE_S)
    return env


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


DEFAULT_GATEWAY = "http://127.0.0.1:28100"  # relax-gym serve/up's default address


def flags(names: Sequence[str], *, gateway: str = DEFAULT_GATEWAY, deadline_s: float | None = None) -> str:
    """The Relax flags to paste after `python -m relax.entrypoints.train ...`, and what they assume
    (`deadline_s` default: the thin client's)."""
    deadline_s = DEFAULT_DEADLINE_S if deadline_s is None else deadline_s
    needs = Needs.of(_definitions(names))
    pairs = " ".join(shlex.quote(f"{k}={v}") for k, v in agent_env(needs, gateway, deadline_s).items())
    lines = [
        f"--use-agentic-rollout --agent-command {CLIENT} --agent-cwd . \\",
        f"  --agent-timeout {_number(deadline_s + CLIENT_MARGIN_S)} \\",
        f"  --agent-env {pairs}",
    ]
    if needs.tools:
        lines[-1] += " \\"
        lines.append("  --agentic-tool-call-parser PARSER")
    routes = " and ".join(needs.routes) + (" routes" if len(needs.routes) > 1 else " route")
    notes = [f"# The agents call Relax's per-session {routes}."]
    if len(needs.environments) > 1:
        notes.append(
            "# Several environments: each row names its own (metadata.environment/config: relax-gym mix)."
        )
    elif needs.config is None:
        notes.append(
            "# Several configs: each row names its own (metadata.config: relax-gym convert tags it)."
        )
    if needs.tools:
        notes.append(
            "# Their model calls carry tools, and Relax parses tool calls only with a parser named:\n"
            "# PARSER is your model's SGLang tool-call parser (e.g. qwen3_coder)."
        )
    return "\n".join([*lines, *notes])


# ---- --check ---------------------------------------------------------------------------------------------


def _options(tokens: Sequence[str]) -> dict[str, list[list[str]]]:
    """Every `--option` of a command line with the values after it (each occurrence its own list)."""
    found: dict[str, list[list[str]]] = {}
    current: list[str] | None = None
    for token in tokens:
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            current = [value] if eq else []
            found.setdefault(name, []).append(current)
        elif current is not None:
            current.append(token)
    return found


def _reachable(url: str) -> str | None:
    """None when the gateway at `url` answers GET /readyz, else why not."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        with opener.open(f"{url.rstrip('/')}/readyz", timeout=10.0) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return str(getattr(exc, "reason", exc))


def problems(
    names: Sequence[str], command: str, *, gateway: str | None = None, deadline_s: float | None = None
) -> list[str]:
    """What is wrong in a Relax command line for these environments (empty: nothing found)."""
    needs = Needs.of(_definitions(names))
    try:
        options = _options(shlex.split(command))
    except ValueError as exc:
        raise ConfigError(f"--check: the command line cannot be split as a shell would: {exc}") from None
    found: list[str] = []
    if "--use-agentic-rollout" not in options:
        found.append("--use-agentic-rollout is missing: Relax would not launch an agent per session")
    commands = options.get("--agent-command", [])
    if not commands or not any(CLIENT in " ".join(values) for values in commands):
        found.append(f"--agent-command does not run {CLIENT}")
    envs = options.get("--agent-env", [])
    if len(envs) > 1:
        found.append(
            f"--agent-env is given {len(envs)} times: Relax keeps only the last; give every pair in one"
        )
    pairs = dict(value.partition("=")[::2] for value in (envs[-1] if envs else []))
    found += [
        f"--agent-env {key}: Relax refuses RELAX_* keys (it sets its own)"
        for key in pairs
        if key.startswith("RELAX_")
    ]
    deadline = deadline_s if deadline_s is not None else _deadline(pairs, found)
    timeouts = options.get("--agent-timeout", [])
    given = timeouts[-1][0] if timeouts and timeouts[-1] else _number(RELAX_AGENT_TIMEOUT_S)
    timeout = _float(given, "--agent-timeout", found)
    if timeout is not None and deadline is not None and timeout <= deadline:
        enough = _number(deadline + CLIENT_MARGIN_S)
        found.append(
            f"--agent-timeout {_number(timeout)} is not above the trial's deadline ({_number(deadline)} s): "
            f"Relax would kill the client before the gateway ends the trial (give {enough})"
        )
    if needs.tools and not any(values for values in options.get("--agentic-tool-call-parser", [])):
        found.append(
            "--agentic-tool-call-parser is missing: these environments' model calls carry tools, and Relax "
            "parses tool calls only with a parser named"
        )
    chosen = pairs.get("NEMO_GYM_ENVIRONMENT")
    if chosen and chosen not in needs.environments:
        found.append(f"NEMO_GYM_ENVIRONMENT={chosen} is not one of {', '.join(needs.environments)}")
    url = gateway or pairs.get("NEMO_GYM_URL")
    if not url:
        found.append("no gateway: NEMO_GYM_URL is not in --agent-env")
    elif (why := _reachable(url)) is not None:
        found.append(f"the gateway at {url} does not answer GET /readyz ({why})")
    return found


def _float(text: str, what: str, found: list[str]) -> float | None:
    try:
        return float(text)
    except ValueError:
        found.append(f"{what} {text!r} is not a number of seconds")
        return None


def _deadline(pairs: Mapping[str, str], found: list[str]) -> float | None:
    return _float(pairs.get("NEMO_GYM_DEADLINE_S", _number(DEFAULT_DEADLINE_S)), "NEMO_GYM_DEADLINE_S", found)
