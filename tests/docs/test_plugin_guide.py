"""docs/plugins.md stays true: its complete example plugin registers, converts and maps results as the
conformance kit requires, and the names the guide points readers to exist."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from relax_gym_core.environments import STATELESS, make_plugin_manager
from relax_gym_core.testing import check_conversion, check_registration, check_result_mapping

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def example_module(tmp_path: Path) -> ModuleType:
    text = GUIDE.read_text()
    match = re.search(r"<!-- example: plugin\.py -->\n```python\n(.*?)```", text, re.DOTALL)
    assert match, "docs/plugins.md lost its example plugin block"
    path = tmp_path / "relax_gym_math_example.py"
    path.write_text(match.group(1))
    spec = importlib.util.spec_from_file_location("relax_gym_math_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_plugin_passes_the_conformance_kit(tmp_path: Path) -> None:
    module = example_module(tmp_path)
    hooks = make_plugin_manager(load_entry_points=False, plugins=[("math_example", module)])
    definition = check_registration(hooks, "math_with_judge", installed=False)
    assert definition.agent == "math_with_judge_simple_agent"
    assert hooks.cleanup_contract("math_with_judge") is STATELESS
    converted = check_conversion(hooks, "math_with_judge", [module.EXAMPLE_ROW], max_examples=20)
    assert converted[0]["input"] == module.EXAMPLE_ROW["responses_create_params"]["input"]
    check_result_mapping(hooks, "math_with_judge")
    probes = hooks.verifier_probes("math_with_judge")
    assert [(p.name, p.expected_reward) for p in probes] == [("right", 1.0), ("wrong", 0.0)]


@pytest.mark.parametrize(
    "dotted",
    [
        "relax_gym_core.testing.check_probes",
        "relax_gym_core.testing.web.ScriptedPolicy",
        "relax_gym_core.testing.OracleScript",
        "relax_gym_core.gym.processes.run_gym_servers",
        "relax_gym_core.environments.EnvironmentFailure",
        "relax_gym_core.environments.RowError",
    ],
)
def test_names_the_guide_points_to_exist(dotted: str) -> None:
    assert dotted.rsplit(".", 1)[1] in GUIDE.read_text()
    module_name, _, attribute = dotted.rpartition(".")
    module = importlib.import_module(module_name)
    assert hasattr(module, attribute)
