"""`relax-gym mix --output OUT [--seed S] ENV[:CONFIG]=RELAX.jsonl ...`: one training dataset from several
converted ones, each row tagged with the environment and config it belongs to.

The thin client routes a row by its `metadata.environment` / `metadata.config` when NEMO_GYM_ENVIRONMENT
is not set, so one Relax job can train on several environments behind one gateway. Rows are never
re-tagged: a row already tagged for another environment is an error naming file and line. Rows a plugin
calls unusable for training (its drop_reason hook) are counted and left out. The shuffle is seeded (the
same seed gives the same file) and the output is written atomically.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from relax_gym_core.errors import ConversionError
from relax_gym_core.jsonl import atomic_output, check_distinct, encode, open_source, read_rows
from relax_gym_core.plugin.host import Hooks, make_plugin_manager, relax_row_problem
from relax_gym_core.rollout.data import ROUTE_KEYS

DEFAULT_SEED = 20260829  # the seed recipe's, so a mix made here matches one made by its script


@frozen
class Source:
    environment: str
    config: str
    path: Path


def parse_route(text: str, hooks: Hooks) -> tuple[str, str]:
    """`ENV[:CONFIG]`, checked against the installed environments (config defaults to the first)."""
    environment, _, config = text.partition(":")
    definition = hooks.environments.get(environment)  # UnknownEnvironmentError names the installed ones
    if not config:
        return environment, definition.configs[0]
    if config not in definition.configs:
        raise ConversionError(
            f"{text!r}: environment {environment!r} has no config {config!r} "
            f"(its configs: {', '.join(definition.configs)})"
        )
    return environment, config


def parse_source(text: str, hooks: Hooks) -> Source:
    """`ENV[:CONFIG]=PATH`, checked against the installed environments (config defaults to the first)."""
    route, separator, path = text.partition("=")
    if not separator or not route or not path:
        raise ConversionError(f"{text!r}: expected ENV[:CONFIG]=RELAX.jsonl")
    return Source(*parse_route(route, hooks), Path(path))


@frozen
class MixReport:
    kept: Counter[str]
    dropped: Counter[tuple[str, str]]  # (environment, reason) -> rows

    def summary(self, output: Path) -> str:
        counts = " ".join(f"{environment}={count}" for environment, count in sorted(self.kept.items()))
        line = f"mixed {counts} total={sum(self.kept.values())} into {output}"
        if self.dropped:
            dropped = ", ".join(
                f"{environment}={count} ({reason})"
                for (environment, reason), count in sorted(self.dropped.items())
            )
            line += f"; dropped {dropped}"
        return line


def tag_row(row: dict[str, Any], environment: str, config: str, where: str) -> dict[str, Any]:
    """A converted row tagged with the environment and config it belongs to (`relax-gym convert` and `mix`
    both tag): the thin client routes it by them. A row tagged otherwise is a ConversionError at `where`."""
    metadata = dict(row["metadata"])
    wanted = {"environment": environment, "config": config}
    for key in ROUTE_KEYS:
        if key in metadata and metadata[key] != wanted[key]:
            raise ConversionError(
                f"{where}: metadata.{key} is {metadata[key]!r}, not {wanted[key]!r}: rows are never "
                "re-tagged; mix each file under the environment it was converted for"
            )
    metadata.update(wanted)
    metadata.setdefault("data_source", environment)  # Relax logs rewards per data source
    return {"input": row["input"], "metadata": metadata}


def _tagged(source: Source, number: int, row: dict[str, Any]) -> dict[str, Any]:
    problem = relax_row_problem(row)
    if problem is not None:
        raise ConversionError(
            f"{source.path}:{number}: not a Relax row ({problem}); convert it first with "
            f"`relax-gym convert {source.environment}`"
        )
    return tag_row(row, source.environment, source.config, f"{source.path}:{number}")


def mix_files(
    hooks: Hooks, sources: Sequence[Source], output: Path, *, seed: int = DEFAULT_SEED
) -> MixReport:
    """Tag, filter and shuffle the rows of every source into `output`; ConversionError on any problem."""
    if not sources:
        raise ConversionError("name at least one ENV[:CONFIG]=RELAX.jsonl to mix")
    rows: list[dict[str, Any]] = []
    kept: Counter[str] = Counter()
    dropped: Counter[tuple[str, str]] = Counter()
    for source in sources:
        check_distinct(source.path, output)
        before = len(rows)
        with open_source(source.path) as stream:
            for number, row in read_rows(source.path, stream):
                tagged = _tagged(source, number, row)
                reason = hooks.environments.get(source.environment).drop_reason(tagged)
                if reason is not None:
                    dropped[(source.environment, reason)] += 1
                    continue
                rows.append(tagged)
        if len(rows) == before:
            raise ConversionError(f"{source.path}: no usable rows for {source.environment}:{source.config}")
        kept[source.environment] += len(rows) - before
    random.Random(seed).shuffle(rows)  # noqa: S311 - a reproducible shuffle, not a secret
    with atomic_output(output) as sink:
        for number, row in enumerate(rows, start=1):
            sink.write(encode(output, number, row))
    return MixReport(kept=kept, dropped=dropped)


def mix(sources: Sequence[str], output: str, *, seed: int | None = None) -> str:
    """What `relax-gym mix` does and prints."""
    hooks = make_plugin_manager()
    parsed = [parse_source(text, hooks) for text in sources]
    report = mix_files(hooks, parsed, Path(output), seed=DEFAULT_SEED if seed is None else seed)
    return report.summary(Path(output))
