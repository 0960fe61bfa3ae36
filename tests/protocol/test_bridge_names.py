"""The bridge's wire names live in relax_gym_core.protocol, spelled once: the core and the plugins use them,
and the servers that run inside the NeMo Gym environment (where relax_gym_core.protocol does not import)
keep copies that must stay equal to them."""

from __future__ import annotations

import ast
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

from relax_gym_core.protocol import (
    BRIDGE_PREFIX,
    ROLLOUT_INDEX,
    ROLLOUT_TAG,
    TASK_INDEX,
    bridge_url,
    rollout_id_of,
    run_indices,
)

ROOT = Path(__file__).resolve().parents[2]
WIRE = {"BRIDGE_PREFIX": "/ng-rollout/", "ROLLOUT_TAG": "relax_gym_rollout"}
# Modules run by the NeMo Gym environment's python, which lacks cattrs (relax_gym_core.protocol needs it).
IN_GYM_COPIES = {
    "plugins/workplace/src/relax_gym_workplace/server.py": ("ROLLOUT_TAG",),
    "plugins/r2e/src/relax_gym_r2e/server.py": ("ROLLOUT_TAG",),
    "plugins/reasoning_gym_cc/src/relax_gym_reasoning_gym_cc/agent.py": ("ROLLOUT_TAG", "BRIDGE_PREFIX"),
}
SPELLED_HERE = "src/relax_gym_core/protocol/bridge.py"


def test_the_wire_names_are_exactly_the_protocols() -> None:
    assert {"BRIDGE_PREFIX": BRIDGE_PREFIX, "ROLLOUT_TAG": ROLLOUT_TAG} == WIRE
    # NeMo Gym's own keys (nemo_gym/global_config.py: TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME).
    assert (TASK_INDEX, ROLLOUT_INDEX) == ("_ng_task_index", "_ng_rollout_index")


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({ROLLOUT_TAG: "abc-0"}, "abc-0"),
        ({ROLLOUT_TAG: "abc-0", "other": 1}, "abc-0"),
        ({}, None),
        ({"other": "abc-0"}, None),
        ({ROLLOUT_TAG: ""}, None),  # empty: no rollout id
        ({ROLLOUT_TAG: None}, None),
        ({ROLLOUT_TAG: 7}, None),
        ({ROLLOUT_TAG: ["abc-0"]}, None),
        ({ROLLOUT_TAG: {"id": "abc-0"}}, None),
        (None, None),
        ("abc-0", None),
        ([(ROLLOUT_TAG, "abc-0")], None),
        (OrderedDict({ROLLOUT_TAG: "abc-0"}), "abc-0"),  # a dict subclass is a dict
    ],
)
def test_rollout_id_of_takes_only_a_non_empty_string_from_a_dict(metadata: Any, expected: str | None) -> None:
    assert rollout_id_of(metadata) == expected


@pytest.mark.parametrize("rollout_id", ["0123456789abcdef0123456789abcdef-0", "task-7-3", "a-b"])
def test_the_run_indices_join_back_to_the_rollout_id_as_nemo_gym_joins_them(rollout_id: str) -> None:
    # NeMo Gym >= 0.5 (maybe_rollout_id_from_run_body): f"{task}-{rollout}" from the /run body's two keys.
    indices = run_indices(rollout_id)
    assert set(indices) == {"_ng_task_index", "_ng_rollout_index"}
    assert f"{indices['_ng_task_index']}-{indices['_ng_rollout_index']}" == rollout_id


def test_bridge_url_is_the_gateway_plus_the_prefix_and_rollout_id() -> None:
    assert bridge_url("http://127.0.0.1:8000", "abc-0") == "http://127.0.0.1:8000/ng-rollout/abc-0"
    # Clients append /v1/<resource>: the result is a route of the bridge.
    assert bridge_url("", "abc-0") + "/v1/messages" == "/ng-rollout/abc-0/v1/messages"


def _module_strings(path: Path) -> tuple[dict[str, Any], list[tuple[int, str]]]:
    """A module's top-level `NAME = <str>` assignments, and every other string constant (docstrings and
    bare string statements left out) with its line."""
    tree = ast.parse(path.read_text(), str(path))
    assigned = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }
    statements = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    strings = [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in statements
    ]
    return assigned, strings


@pytest.mark.parametrize("path", sorted(IN_GYM_COPIES))
def test_the_copies_in_the_nemo_gym_environment_equal_the_protocols(path: str) -> None:
    assigned, _ = _module_strings(ROOT / path)
    for name in IN_GYM_COPIES[path]:
        assert assigned.get(name) == WIRE[name], f"{path}: {name} differs from relax_gym_core.protocol's"


def test_nothing_else_spells_the_wire_names() -> None:
    sources = sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "plugins").glob("*/src/**/*.py"))
    spelled: list[str] = []
    for path in sources:
        relative = str(path.relative_to(ROOT))
        if relative == SPELLED_HERE:
            continue
        copies = {WIRE[name] for name in IN_GYM_COPIES.get(relative, ())}
        _, strings = _module_strings(path)
        spelled += [
            f"{relative}:{line}: {text!r}"
            for line, text in strings
            if any(wire in text for wire in WIRE.values()) and text not in copies
        ]
    assert spelled == [], "import the wire names from relax_gym_core.protocol"
