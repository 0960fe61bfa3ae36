"""The bridge's wire names are spelled once, in relax_gym_core.ingym (standard library only, so the servers
that run inside the NeMo Gym environment import them too), and relax_gym_core.protocol re-exports them:
the core, the plugins and their in-gym servers all use the same names, and nothing else spells them."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import types
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

from relax_gym_core import ingym, protocol
from relax_gym_core.ingym import CLEANUP_PATH, CleanedRollouts, rollout_id_of
from relax_gym_core.protocol import (
    BRIDGE_PREFIX,
    ROLLOUT_ID,
    ROLLOUT_INDEX,
    ROLLOUT_TAG,
    TASK_INDEX,
    TOKEN_CAPTURE_SEGMENT,
    attempt_of,
    bridge_url,
    run_indices,
    tag_of,
)
from relax_gym_core.protocol.bridge import model_call_route

ROOT = Path(__file__).resolve().parents[2]
WIRE = {
    "BRIDGE_PREFIX": "/ng-rollout/",
    "ROLLOUT_TAG": "relax_gym_rollout",
    # NeMo Gym's own keys (nemo_gym/global_config.py: TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME).
    "TASK_INDEX": "_ng_task_index",
    "ROLLOUT_INDEX": "_ng_rollout_index",
    "CLEANUP_PATH": "/cleanup/{rollout_id}",
    # NeMo Gym main's (global_config.py: ROLLOUT_ID_KEY_NAME, ATTEMPT_INDEX_KEY_NAME; config_types.py:
    # TOKEN_CAPTURE_PATH_SEGMENT).
    "ROLLOUT_ID": "_ng_rollout_id",
    "ATTEMPT_INDEX": "_ng_attempt_index",
    "TOKEN_CAPTURE_SEGMENT": "training-token-capture",
}
SPELLED_HERE = "src/relax_gym_core/ingym/__init__.py"


def test_the_wire_names_are_exactly_these() -> None:
    assert {name: getattr(ingym, name) for name in WIRE} == WIRE
    assert tuple(WIRE.values())[:5] == (BRIDGE_PREFIX, ROLLOUT_TAG, TASK_INDEX, ROLLOUT_INDEX, CLEANUP_PATH)
    assert (WIRE["ROLLOUT_ID"], WIRE["TOKEN_CAPTURE_SEGMENT"]) == (ROLLOUT_ID, TOKEN_CAPTURE_SEGMENT)


def test_the_protocol_re_exports_the_names_and_tag_of_of_ingym() -> None:
    names = (
        "BRIDGE_PREFIX",
        "ROLLOUT_TAG",
        "TASK_INDEX",
        "ROLLOUT_INDEX",
        "ROLLOUT_ID",
        "tag_of",
        "attempt_of",
    )
    for name in (*names, "TOKEN_CAPTURE_SEGMENT"):
        assert getattr(protocol, name) is getattr(ingym, name), name
    assert not hasattr(protocol, "rollout_id_of")  # the /run body's id is ingym's (servers read it)


def test_ingym_imports_the_standard_library_only() -> None:
    # It runs in the NeMo Gym environment's python, which has NeMo Gym's dependencies, not the core's.
    code = (
        "import json, sys; before = set(sys.modules); "
        "import relax_gym_core.ingym, relax_gym_core.ingym.sandbox; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    loaded = json.loads(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    beyond = [name for name in loaded if name.split(".")[0] not in sys.stdlib_module_names]
    assert beyond == ["relax_gym_core", "relax_gym_core.ingym", "relax_gym_core.ingym.sandbox"]


METADATA_CASES: list[tuple[Any, str | None]] = [
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
    (OrderedDict({ROLLOUT_TAG: "abc-0"}), "abc-0"),  # any mapping
    (types.MappingProxyType({ROLLOUT_TAG: "abc-0"}), "abc-0"),
]


@pytest.mark.parametrize(("metadata", "expected"), METADATA_CASES)
def test_tag_of_takes_only_a_non_empty_string_from_the_params_metadata(
    metadata: Any, expected: str | None
) -> None:
    assert tag_of({"metadata": metadata, "input": []}) == expected
    # A NeMo Gym params model (pydantic) is read by its attribute.
    assert tag_of(types.SimpleNamespace(metadata=metadata, input=[])) == expected


@pytest.mark.parametrize("params", [None, {}, [], "abc-0", {ROLLOUT_TAG: "abc-0"}, types.SimpleNamespace()])
def test_tag_of_params_without_metadata_is_none(params: Any) -> None:
    assert tag_of(params) is None  # the tag is under metadata, never at the top of params


@pytest.mark.parametrize("rollout_id", ["0123456789abcdef0123456789abcdef-0", "task-7-3", "a-b"])
def test_the_run_indices_join_back_to_the_rollout_id_as_nemo_gym_joins_them(rollout_id: str) -> None:
    # NeMo Gym main (maybe_rollout_id_from_run_body): the explicit _ng_rollout_id; v0.5.0 and the commit Relax
    # pins: f"{task}-{rollout}" from the /run body's two keys.
    indices = run_indices(rollout_id)
    assert set(indices) == {"_ng_rollout_id", "_ng_task_index", "_ng_rollout_index"}
    assert indices["_ng_rollout_id"] == rollout_id
    assert f"{indices['_ng_task_index']}-{indices['_ng_rollout_index']}" == rollout_id
    assert rollout_id_of({"responses_create_params": {"input": []}, **indices}) == rollout_id
    pair = {key: value for key, value in indices.items() if key != ROLLOUT_ID}
    assert rollout_id_of({"responses_create_params": {"input": []}, **pair}) == rollout_id


@pytest.mark.parametrize(
    ("rollout_id", "names"),
    [
        ("abc-0-a1", "abc-0"),
        ("abc-0-a12", "abc-0"),
        ("abc-0", None),
        ("abc-0-a0", None),  # attempt 0 has no suffix
        ("abc-0-a", None),
        ("abc-0-ax", None),
        ("-a1", None),
        ("abc-0-a1\u0661", None),  # digits are ASCII digits
    ],
)
def test_an_attempt_suffix_names_its_rollout(rollout_id: str, names: str | None) -> None:
    assert attempt_of(rollout_id.encode().decode("unicode_escape")) == names


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/ng-rollout/abc-0/v1/responses", ("abc-0", "v1/responses")),
        ("/ng-rollout/abc-0/training-token-capture/v1/messages", ("abc-0", "v1/messages")),
        ("/ng-rollout/abc-0-a2/v1/chat/completions", ("abc-0-a2", "v1/chat/completions")),
        ("/ng-rollout//v1/responses", None),
        ("/v1/responses", None),
    ],
)
def test_a_prefixed_model_call_names_its_rollout_with_or_without_token_capture(
    path: str, route: tuple[str, str] | None
) -> None:
    assert model_call_route(path) == route


TAGGED = {"input": [], "metadata": {ROLLOUT_TAG: "tag-1"}}


@pytest.mark.parametrize(
    ("fields", "params", "expected"),
    [
        (
            {TASK_INDEX: "t", ROLLOUT_INDEX: "2", "responses_create_params": TAGGED},
            None,
            "t-2",
        ),  # indices win
        ({TASK_INDEX: 5, ROLLOUT_INDEX: 0}, None, "5-0"),  # NeMo Gym's own collection numbers them
        ({ROLLOUT_ID: "explicit", TASK_INDEX: "t", ROLLOUT_INDEX: "2"}, None, "explicit"),  # main: it wins
        ({ROLLOUT_ID: "", TASK_INDEX: "t", ROLLOUT_INDEX: "2"}, None, "t-2"),
        ({ROLLOUT_ID: 7, TASK_INDEX: "t", ROLLOUT_INDEX: "2"}, None, "t-2"),
        ({TASK_INDEX: "t", "responses_create_params": TAGGED}, None, "tag-1"),  # one index: the tag
        ({TASK_INDEX: "", ROLLOUT_INDEX: "0", "responses_create_params": TAGGED}, None, "tag-1"),
        ({TASK_INDEX: True, ROLLOUT_INDEX: False, "responses_create_params": TAGGED}, None, "tag-1"),
        ({TASK_INDEX: 1.5, ROLLOUT_INDEX: "0"}, None, None),
        ({"responses_create_params": TAGGED}, None, "tag-1"),
        ({"responses_create_params": TAGGED}, {"metadata": {ROLLOUT_TAG: "given"}}, "given"),  # params win
        ({}, TAGGED, "tag-1"),  # what an agent forwards of the body: its own params
        (None, TAGGED, "tag-1"),
        ({"responses_create_params": {"input": []}}, None, None),  # a plain NeMo Gym rollout collection
        (None, None, None),
        ({"responses_create_params": "x"}, None, None),
    ],
)
def test_rollout_id_of_reads_the_indices_else_the_tag(fields: Any, params: Any, expected: str | None) -> None:
    assert rollout_id_of(fields, params) == expected


def test_bridge_url_is_the_gateway_plus_the_prefix_and_rollout_id() -> None:
    assert bridge_url("http://127.0.0.1:8000", "abc-0") == "http://127.0.0.1:8000/ng-rollout/abc-0"
    # Clients append /v1/<resource>: the result is a route of the bridge.
    assert bridge_url("", "abc-0") + "/v1/messages" == "/ng-rollout/abc-0/v1/messages"


def test_the_cleanup_path_names_the_rollout() -> None:
    assert CLEANUP_PATH.format(rollout_id="abc-0") == "/cleanup/abc-0"


def test_cleaned_rollouts_remember_the_latest_up_to_capacity() -> None:
    cleaned = CleanedRollouts(capacity=2)
    for rollout_id in ("a", "b", "a", "c"):  # "a" again: now the newest, so "b" is the oldest
        cleaned.add(rollout_id)
    assert ("a" in cleaned, "b" in cleaned, "c" in cleaned) == (True, False, True)
    assert len(cleaned) == 2
    assert 7 not in cleaned
    assert len(CleanedRollouts(capacity=0)) == 0
    at_least_one = CleanedRollouts(capacity=0)
    at_least_one.add("x")
    assert "x" in at_least_one  # a capacity below 1 still remembers the last one


def _module_strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a module (docstrings and bare string statements left out) with its line."""
    tree = ast.parse(path.read_text(), str(path))
    statements = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in statements
    ]


def test_nothing_else_spells_the_wire_names() -> None:
    # No copies any more: the plugins' servers in the NeMo Gym environment import relax_gym_core.ingym.
    sources = sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "plugins").glob("*/src/**/*.py"))
    spelled: list[str] = []
    for path in sources:
        relative = str(path.relative_to(ROOT))
        if relative == SPELLED_HERE:
            continue
        spelled += [
            f"{relative}:{line}: {text!r}"
            for line, text in _module_strings(path)
            if any(wire in text for wire in WIRE.values())
        ]
    assert spelled == [], "import the wire names from relax_gym_core.ingym (or relax_gym_core.protocol)"
