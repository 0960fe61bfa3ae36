"""The rows a rollout runs: a Relax JSONL file (from `relax-gym convert` or `mix`), each row routed to the
environment and config that runs it, and the example rows plugins bundle (their verifier probes' rows).

A row's identity in a run is its line number in the data file plus a digest of its content, so a rerun
with the same --out can tell "the same data" (resume) from "different data" (refused).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from attrs import frozen

from relax_gym_core.errors import ConversionError
from relax_gym_core.jsonl import open_source, read_rows
from relax_gym_core.plugin.host import Hooks, converted_row, relax_row_problem

ECHO = "echo"  # the built-in environment: no plugin registers it, every gateway can serve it

ROUTE_KEYS = ("environment", "config")  # the metadata keys the thin client routes a row by
MIX_TAGS = (*ROUTE_KEYS, "data_source")  # what `relax-gym mix` adds to a row's metadata


@frozen
class Route:
    environment: str
    config: str

    def __str__(self) -> str:
        return f"{self.environment}:{self.config}"


@frozen
class DataRow:
    line: int  # the row's line in the data file: its id in trials.jsonl
    route: Route
    task: dict[str, Any]  # the trial's task, as Relax sends a session: {"messages", "metadata"}
    digest: str  # of the row's content; a resumed run must see the same row at the same line
    row_id: str | None  # the row's own id (metadata.id), when it has one


type ConfigOf = Callable[[str, str | None], str]  # (environment, asked config) -> config, or an error


def task_identity(messages: Any, metadata: Any) -> str:
    """Which task a row is, whether `relax-gym mix` tagged it or not: its prompt and its metadata without
    the mix's tags (canonical JSON)."""
    rest = {k: v for k, v in metadata.items() if k not in MIX_TAGS} if isinstance(metadata, dict) else {}
    return json.dumps([messages, rest], sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def row_digest(row: dict[str, Any]) -> str:
    canonical = json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def config_resolver(hooks: Hooks, *, remote: bool) -> ConfigOf:
    """How an environment's config is chosen and checked: the installed plugins know their configs; a
    gateway given with --gateway may serve environments not installed here (then the config defaults to
    the environment's name, as the thin client's routing does)."""

    def resolve(environment: str, config: str | None) -> str:
        if environment == ECHO:
            return config or ECHO
        if remote and environment not in {d.name for d in hooks.environments}:
            return config or environment
        try:
            definition = hooks.environments.get(environment)
        except LookupError as exc:
            raise ConversionError(f"{exc}; `{ECHO}` is built in") from None
        if config is None:
            return definition.configs[0]
        if config not in definition.configs:
            raise ConversionError(
                f"environment {environment!r} has no config {config!r} "
                f"(its configs: {', '.join(definition.configs)})"
            )
        return config

    return resolve


def parse_target(text: str, config_of: ConfigOf) -> Route:
    """`ENV[:CONFIG]` as given on the command line."""
    environment, _, config = text.partition(":")
    if not environment:
        raise ConversionError(f"{text!r}: expected ENV[:CONFIG]")
    return Route(environment, config_of(environment, config or None))


def _route_of(
    path: Path, number: int, metadata: dict[str, Any], target: Route | None, config_of: ConfigOf
) -> Route:
    tags: dict[str, str] = {}
    for key in ROUTE_KEYS:
        value = metadata.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise ConversionError(f"{path}:{number}: metadata.{key} must be a string")
        tags[key] = value
    if target is not None:
        tagged = tags.get("environment")
        if tagged is not None and tagged != target.environment:
            raise ConversionError(
                f"{path}:{number}: the row is tagged for environment {tagged!r}, not {target.environment!r}; "
                "leave ENV out to route each row by its tag"
            )
        return target
    environment = tags.get("environment")
    if environment is None:
        raise ConversionError(
            f"{path}:{number}: no metadata.environment: name ENV[:CONFIG] on the command line, or build "
            "the file with `relax-gym mix`, which tags every row"
        )
    try:
        return Route(environment, config_of(environment, tags.get("config")))
    except ConversionError as exc:
        raise ConversionError(f"{path}:{number}: {exc}") from None


def _rows(path: Path, target: Route | None, config_of: ConfigOf, limit: int | None) -> Iterator[DataRow]:
    count = 0
    with open_source(path) as source:
        for number, row in read_rows(path, source):
            problem = relax_row_problem(row)
            if problem is not None:
                raise ConversionError(
                    f"{path}:{number}: not a Relax row ({problem}); convert it first with "
                    "`relax-gym convert ENV`"
                )
            metadata: dict[str, Any] = row["metadata"]
            identity = metadata.get("id")
            yield DataRow(
                line=number,
                route=_route_of(path, number, metadata, target, config_of),
                task={"messages": row["input"], "metadata": metadata},
                digest=row_digest(row),
                row_id=str(identity) if isinstance(identity, str | int) else None,
            )
            count += 1
            if limit is not None and count >= limit:
                return


def load_rows(path: Path, target: Route | None, config_of: ConfigOf, *, limit: int | None) -> list[DataRow]:
    """Every row to run (the first `limit`), routed; ConversionError naming file:line on the first problem."""
    rows = list(_rows(path, target, config_of, limit))
    if not rows:
        raise ConversionError(f"{path}: no rows to run")
    return rows


def example_rows(hooks: Hooks, environment: str) -> list[dict[str, Any]]:
    """A plugin's bundled example rows as Relax rows tagged with their route (as `relax-gym mix` tags them).

    There is no hook for example rows: the rows of the environment's verifier probes are the examples
    every plugin already ships (and the oracle policy knows how to solve them), each taken once; a skipped
    probe's row (one that cannot be replayed here) is not one.
    """
    definition = hooks.environments.get(environment)
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    for probe in definition.verifier_probes():
        if probe.skip is not None:
            continue
        raw = dict(probe.row)
        key = row_digest(raw)
        if key in seen:
            continue
        seen.add(key)
        converted = converted_row(definition, raw)
        metadata = {**converted["metadata"], "environment": environment, "config": definition.configs[0]}
        rows.append({"input": converted["input"], "metadata": metadata})
    return rows
