"""The conformance kit as a test class: a plugin's own contract tests are a subclass of a few lines.

    from relax_gym_core.testing import EnvironmentContract

    from my_plugin import example_rows

    class TestMyEnvironmentContract(EnvironmentContract):
        environment = "my_environment"

        def rows(self):
            return example_rows()  # real raw rows of the environment

pytest collects its five tests for the subclass: registration, conversion (the rows, their /run bodies and
generated broken rows), result mapping (rewards kept; missing rewards, `failure_bodies` and what NeMo Gym
reports as unscored never a score), the verifier probes scored by the environment's real verifier (a NeMo
Gym server the session shares), and one known-good probe row as a real trial through `relax-gym up` with
the oracle as its policy (the last two are e2e tests). Override `hooks` (a fixture-like method taking
`relax_gym_hooks`) to test a plugin that is not installed, with `installed = False`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar

from relax_gym_core.plugin.host import Hooks, make_plugin_manager
from relax_gym_core.testing.contract import (
    REFERENCE_NORMALISED,
    check_conversion,
    check_probes,
    check_registration,
    check_result_mapping,
)


class EnvironmentContract:
    """Subclass it (name the subclass Test...) with `environment` and `rows()`; the rest is optional."""

    environment: ClassVar[str]
    installed: ClassVar[bool] = True  # the plugin is an installed distribution with a version
    normalised: ClassVar[Collection[str]] = REFERENCE_NORMALISED  # top-level keys conversion may change
    result_body: ClassVar[Mapping[str, Any] | None] = None  # a normal /run answer (default: empty output)
    failure_bodies: ClassVar[Sequence[Mapping[str, Any]]] = ()  # answers that are infrastructure failures
    failure_kind: ClassVar[str | None] = None  # the kind each of them must raise (e.g. "verifier_error")
    # NeMo Gym's own "could not score" answers (a failed judge, a masked sample) must end failed by name;
    # False only for an environment that knows better (its map_result decides for itself).
    reported_failures: ClassVar[bool] = True
    require_contrast: ClassVar[bool] = True  # probes must expect at least two different rewards

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Mark the subclass `nemo_gym(environment)`: its server tests then share the session's servers with
        the other tests of that environment (one worker, one start)."""
        super().__init_subclass__(**kwargs)
        if getattr(cls, "environment", None) and cls.installed:
            import pytest  # noqa: PLC0415 - the kit's tests run under pytest; the module imports without it

            marks = [*getattr(cls, "pytestmark", []), pytest.mark.nemo_gym(cls.environment)]
            setattr(cls, "pytestmark", marks)  # noqa: B010 - pytest reads the attribute; the class declares none

    def rows(self) -> Sequence[Mapping[str, Any]]:
        """Real raw rows of the environment (its dataset's, or upstream's example rows)."""
        raise NotImplementedError(f"{type(self).__name__}.rows() must return real raw rows")

    def hooks(self, relax_gym_hooks: Hooks) -> Hooks:
        """The plugin manager the checks use: every installed plugin, by default."""
        return relax_gym_hooks

    def test_registration(self, relax_gym_hooks: Hooks) -> None:
        check_registration(self.hooks(relax_gym_hooks), self.environment, installed=self.installed)

    def test_conversion(self, relax_gym_hooks: Hooks) -> None:
        check_conversion(
            self.hooks(relax_gym_hooks), self.environment, self.rows(), normalised=self.normalised
        )

    def test_result_mapping(self, relax_gym_hooks: Hooks) -> None:
        check_result_mapping(
            self.hooks(relax_gym_hooks),
            self.environment,
            body=self.result_body,
            failure_bodies=self.failure_bodies,
            failure_kind=self.failure_kind,
            reported_failures=self.reported_failures,
        )

    def test_probes(self, relax_gym_hooks: Hooks, relax_gym_verifier: Callable[..., Any]) -> None:
        hooks = self.hooks(relax_gym_hooks)
        verifier = relax_gym_verifier(self.environment, hooks=hooks)
        check_probes(hooks, self.environment, verifier, require_contrast=self.require_contrast)

    def test_trial(self, relax_gym_hooks: Hooks, relax_gym_up: Callable[..., Any]) -> None:
        """A known-good probe row as a real trial through the environment's agent (`relax-gym up`, the
        oracle as its policy): the wiring, the /run body and the result mapping, not only /verify."""
        import pytest  # noqa: PLC0415 - the kit's tests run under pytest; the module imports without it

        from relax_gym_core.testing.trial import check_trial  # noqa: PLC0415 - needs the web stack

        if not self.installed:
            pytest.skip("`relax-gym up` runs installed plugins only: this one is registered in-process")
        hooks = self.hooks(relax_gym_hooks)
        check_trial(hooks, self.environment, relax_gym_up(self.environment).url)


def unscored_answers(body: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The /run answers a plugin must treat as infrastructure failures, made from one real answer `body`:
    its reward missing, null, text or boolean, its response missing or without output, and NeMo Gym's
    error answer. For `failure_bodies` (each must raise EnvironmentFailure, never become a score)."""
    real = dict(body)
    return {
        "no reward": {key: value for key, value in real.items() if key != "reward"},
        "null reward": {**real, "reward": None},
        "text reward": {**real, "reward": "1.0"},
        "boolean reward": {**real, "reward": True},
        "no response": {key: value for key, value in real.items() if key != "response"},
        "response without output": {**real, "response": {"id": "resp_1"}},
        "error answer": {"detail": "Hit an exception calling an inner server"},
    }


def plugin_hooks(name: str, module: object) -> Hooks:
    """A plugin manager with only this plugin (registered in-process, entry points not loaded): what a
    plugin's own tests check it with, whatever else is installed."""
    return make_plugin_manager(load_entry_points=False, blocked=(), plugins=[(name, module)])
