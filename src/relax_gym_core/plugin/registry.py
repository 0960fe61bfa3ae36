"""The registries the registration hooks fill: environments and runtimes, checked for duplicates."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from relax_gym_core.errors import DuplicateEnvironmentError, PluginError, UnknownEnvironmentError
from relax_gym_core.plugin.cleanup import CleanupContract
from relax_gym_core.plugin.environment import EnvironmentDefinition, reference_environment
from relax_gym_core.plugin.servers import POLICY_MODEL, SERVER_KINDS

if TYPE_CHECKING:
    from relax_gym_core.plugin.runs import Runtime
    from relax_gym_core.plugin.specs import EnvironmentSpec

# A runtime for one registered (environment, config): its spec, and the environment's object.
type RuntimeFactory = Callable[[EnvironmentSpec, EnvironmentDefinition], Runtime]


class EnvironmentRegistrar:
    """What a plugin's register_environments hook receives."""

    def __init__(self, registry: EnvironmentRegistry, plugin: str) -> None:
        self._registry = registry
        self._plugin = plugin
        self._added: list[str] = []

    def add(self, definition: EnvironmentDefinition) -> None:
        self._registry.add(definition, plugin=self._plugin)
        self._added.append(definition.name)

    def registered(self, name: str) -> str | None:
        """The plugin that registered environment `name` already, or None: a plugin that fills gaps (hooked
        with `trylast=True`, so it runs after the others) leaves a taken name to its owner."""
        return self._registry.owners.get(name)

    @property
    def added(self) -> tuple[str, ...]:
        """The environments the plugin registered through it, in order (the plugin trace shows them)."""
        return tuple(self._added)


def _references(value: Any) -> Iterator[tuple[str, str]]:
    """Every server reference in a server's config, as NeMo Gym writes one: {"type": KIND, "name": NAME}."""
    if isinstance(value, Mapping):
        kind, name = value.get("type"), value.get("name")
        if isinstance(kind, str) and kind in SERVER_KINDS and isinstance(name, str):
            yield kind, name
        for inner in value.values():
            yield from _references(inner)
    elif isinstance(value, list | tuple):
        for inner in value:
            yield from _references(inner)


def wiring_problem(definition: EnvironmentDefinition) -> str | None:
    """What is wrong with how an environment's servers name each other, or None: every server a config
    refers to (a resources server, a model server) and every readiness name is one of its own servers, or
    the policy model (the gateway). A typo would otherwise pass registration and probes and fail every
    trial with a 500 inside the agent. An environment that says it cannot start here (unavailable(): an
    LLM judge no variable names) may name a server it lacks until then."""
    names = {server.name for server in definition.servers}
    own = ", ".join(sorted(names)) or "none"
    for server in definition.servers:
        for kind, name in _references(server.config):
            if name in names or (kind == "responses_api_models" and name == POLICY_MODEL):
                continue
            if definition.unavailable() is not None:
                return None
            what = kind.removesuffix("s").replace("_", " ")
            return f"server {server.name!r} names {what} {name!r}, which is not one of its servers ({own})"
    for name in definition.readiness or ():
        if name not in names:
            return f"readiness names {name!r}, which is not one of its servers ({own})"
    return None


class EnvironmentRegistry:
    def __init__(self) -> None:
        self._definitions: dict[str, EnvironmentDefinition] = {}
        self._owners: dict[str, str] = {}

    def add(self, definition: EnvironmentDefinition, *, plugin: str) -> None:
        if not isinstance(definition, EnvironmentDefinition):
            raise PluginError(
                f"plugin {plugin!r} registers {type(definition).__name__}, not an EnvironmentDefinition"
            )
        if not isinstance(definition.cleanup, CleanupContract):
            raise PluginError(f"plugin {plugin!r}: environment {definition.name!r} has no CleanupContract")
        if not definition.configs:
            raise PluginError(f"plugin {plugin!r}: environment {definition.name!r} registers no config")
        names = {server.name for server in definition.servers}
        if definition.runtime == "nemo_gym" and definition.agent not in names:
            raise PluginError(
                f"plugin {plugin!r}: environment {definition.name!r}: agent {definition.agent!r} "
                "is not one of its servers"
            )
        problem = wiring_problem(definition)
        if problem is not None:
            raise PluginError(f"plugin {plugin!r}: environment {definition.name!r}: {problem}")
        owner = self._owners.get(definition.name)
        if owner is not None:
            raise DuplicateEnvironmentError(
                f"environment {definition.name!r} is registered by both plugin {owner!r} "
                f"and plugin {plugin!r}"
            )
        self._definitions[definition.name] = definition
        self._owners[definition.name] = plugin

    def get(self, name: str) -> EnvironmentDefinition:
        try:
            return self._definitions[name]
        except KeyError:
            known = ", ".join(sorted(self._definitions)) or "none"
            raise UnknownEnvironmentError(
                f"no installed plugin provides environment {name!r} (installed: {known}); "
                "run `relax-gym plugins` to see what is installed"
            ) from None

    def lookup(self, name: str) -> EnvironmentDefinition:
        """The registered environment, else the reference behaviour (an environments file may name an
        environment no plugin registers: `relax-gym serve` runs it the reference's way)."""
        found = self._definitions.get(name)
        return found if found is not None else reference_environment(name)

    def owner(self, name: str) -> str:
        self.get(name)
        return self._owners[name]

    @property
    def owners(self) -> Mapping[str, str]:
        """Environment name -> the plugin that registered it, so far."""
        return self._owners

    def __iter__(self) -> Iterator[EnvironmentDefinition]:
        return iter(sorted(self._definitions.values(), key=lambda d: d.name))

    def __len__(self) -> int:
        return len(self._definitions)


class RuntimeRegistrar:
    """What a plugin's register_runtimes hook receives."""

    def __init__(self, factories: dict[str, tuple[str, RuntimeFactory]], plugin: str) -> None:
        self._factories = factories
        self._plugin = plugin
        self._added: list[str] = []

    def add(self, name: str, factory: RuntimeFactory) -> None:
        if not name.strip():
            raise PluginError(f"plugin {self._plugin!r} registers a runtime with an empty name")
        taken = self._factories.get(name)
        if taken is not None:
            raise PluginError(
                f"runtime {name!r} is registered by both plugin {taken[0]!r} and plugin {self._plugin!r}"
            )
        self._factories[name] = (self._plugin, factory)
        self._added.append(name)

    @property
    def added(self) -> tuple[str, ...]:
        """The runtimes the plugin registered through it, in order (the plugin trace shows them)."""
        return tuple(self._added)
