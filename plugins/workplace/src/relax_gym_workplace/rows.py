"""Workplace rows: validation and ground-truth normalisation of raw rows and /run bodies.

Raw rows (HF ``nvidia/Nemotron-RL-agent-workplace_assistant``, upstream ``data/example.jsonl``) carry
``responses_create_params`` (input messages and the tool schemas the model may use), ``ground_truth``,
``category``, ``environment_name`` and ``id``. The upstream verifier needs the last four on every
``/verify``, and it silently misbehaves on a bad ``ground_truth``: given a string, it iterates
characters, every "action" fails and is skipped, and any answer that writes nothing scores 1.0. So a
string ``ground_truth`` is parsed here, and every call must name one of the row's tools with JSON-object
arguments; anything else is a RowError naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from relax_gym_core.plugin import RowError

TOOLS_FIELD = "responses_create_params.tools"
# Verifier fields besides ground_truth, with the JSON type upstream's WorkbenchVerifyRequest requires.
_REQUIRED: tuple[tuple[str, type, str], ...] = (
    ("id", int, "an integer"),
    ("category", str, "a string"),
    ("environment_name", str, "a string"),
)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def row_tools(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The row's own tool schemas (never a built-in list: data sets differ, e.g. 26 vs 27 tools)."""
    if "tools" not in params:
        raise RowError(f"{TOOLS_FIELD} is missing: the model can only call the tools the row lists")
    tools = params["tools"]
    if not isinstance(tools, list) or not tools:
        raise RowError(f"{TOOLS_FIELD} must be a non-empty list of function schemas (got {tools!r:.80})")
    names: set[str] = set()
    for index, tool in enumerate(tools):
        where = f"{TOOLS_FIELD}[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise RowError(f"{where} must be a function schema object with type 'function'")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise RowError(f"{where}.name must be a non-empty string")
        if "parameters" in tool and not isinstance(tool["parameters"], dict):
            raise RowError(f"{where}.parameters must be a JSON schema object")
        if name in names:
            raise RowError(f"{where}.name {name!r} is listed twice")
        names.add(name)
    return tools


def normalise_ground_truth(value: Any, *, tool_names: set[str] | None = None) -> list[dict[str, str]]:
    """``ground_truth`` as upstream must see it: a list of ``{"name": str, "arguments": JSON string}``.

    Accepts the list form or a JSON string of it; ``arguments`` given as an object is serialised.
    ``tool_names`` (the row's tools) makes a call to an unknown tool an error: upstream would skip it.
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowError(f"ground_truth is a string but not JSON ({exc})") from None
        if not isinstance(value, list):
            raise RowError(f"ground_truth is a JSON string of {_type_name(value)}, not of a list of calls")
    if not isinstance(value, list):
        raise RowError(f"ground_truth must be a list of {{name, arguments}} calls, not {_type_name(value)}")
    return [_normalise_call(index, item, tool_names) for index, item in enumerate(value)]


def _normalise_call(index: int, item: Any, tool_names: set[str] | None) -> dict[str, str]:
    where = f"ground_truth[{index}]"
    if not isinstance(item, dict):
        raise RowError(f"{where} must be an object with name and arguments, not {_type_name(item)}")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise RowError(f"{where}.name must be a non-empty string")
    if tool_names is not None and name not in tool_names:
        raise RowError(f"{where}.name {name!r} is not one of the row's tools ({TOOLS_FIELD})")
    arguments = item.get("arguments")
    if isinstance(arguments, dict):
        parsed: Any = arguments
        arguments = json.dumps(arguments)
    elif isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError as exc:
            raise RowError(f"{where}.arguments is not valid JSON ({exc})") from None
    else:
        raise RowError(f"{where}.arguments must be a JSON string or object, not {_type_name(arguments)}")
    if not isinstance(parsed, dict):
        raise RowError(f"{where}.arguments must encode a JSON object, not {_type_name(parsed)}")
    return {"name": name, "arguments": arguments}


def normalise_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The raw row (or /run body) checked, with ``ground_truth`` in list form; other keys unchanged."""
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        raise RowError("responses_create_params must be an object (with input and tools)")
    messages = params.get("input")
    if not isinstance(messages, list) or not messages:
        raise RowError("responses_create_params.input must be a non-empty messages array")
    tools = row_tools(params)
    for field, kind, described in _REQUIRED:
        if field not in row:
            raise RowError(f"{field} is missing (the workplace verifier requires it)")
        value = row[field]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise RowError(f"{field} must be {described}, not {_type_name(value)}")
    if "ground_truth" not in row:
        raise RowError("ground_truth is missing (the workplace verifier requires it)")
    normalised = dict(row)
    normalised["ground_truth"] = normalise_ground_truth(
        row["ground_truth"], tool_names={tool["name"] for tool in tools}
    )
    return normalised


def drop_reason(relax_row: dict[str, Any]) -> str | None:
    """Rows with no ground truth teach nothing: doing nothing would score 1.0 on them."""
    metadata = relax_row.get("metadata")
    truth = metadata.get("ground_truth") if isinstance(metadata, dict) else None
    return None if truth else "no ground truth"
