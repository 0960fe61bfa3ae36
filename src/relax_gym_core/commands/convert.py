"""`relax-gym convert ENV[:CONFIG]`: a raw NeMo Gym JSONL file into a Relax one, through the plugins'
convert_row, each row tagged with its environment and config (as `relax-gym mix` tags them), so the thin
client routes it whatever NEMO_GYM_ENVIRONMENT / NEMO_GYM_CONFIG say or leave out.

The reference converter's file safety: the source is never opened for writing, the output is replaced
atomically, and every refusal names the file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

from relax_gym_core.commands.mix import parse_route, tag_row
from relax_gym_core.errors import ConversionError, PluginError, RowError
from relax_gym_core.jsonl import atomic_output, check_distinct, encode, open_source, read_rows
from relax_gym_core.plugin import EnvironmentDefinition
from relax_gym_core.plugin.host import Hooks, converted_row, make_plugin_manager


def _write_rows(
    environment: EnvironmentDefinition,
    config: str,
    path: Path,
    source: IO[bytes],
    sink: IO[bytes],
    *,
    limit: int | None,
) -> int:
    count = 0
    for number, row in read_rows(path, source):
        try:
            converted = converted_row(environment, row)
        except (RowError, PluginError) as exc:  # PluginError: the plugin broke the Relax row shape
            raise ConversionError(f"{path}:{number}: {exc}") from None
        except Exception as exc:  # a plugin bug: keep its traceback, say where it happened
            exc.add_note(f"while converting {path}:{number} for environment {environment.name!r}")
            raise
        tagged = tag_row(converted, environment.name, config, f"{path}:{number}")
        sink.write(encode(path, number, tagged))
        count += 1
        if limit is not None and count >= limit:
            break
    if not count:
        raise ConversionError(f"No rows converted from {path}")
    return count


def convert_file(
    hooks: Hooks, environment: str, input_path: Path, output_path: Path, *, limit: int | None = None
) -> int:
    """Convert each row of `input_path` with the environment's convert_row into `output_path`, tagged
    with `environment` (ENV[:CONFIG]; the config defaults to the environment's first).

    Returns the number of rows written. Raises ConversionError (or UnknownEnvironmentError) on the first
    problem; then the temporary file is gone and an existing output is left as it was.
    """
    if limit is not None and limit < 1:
        raise ConversionError("--limit must be greater than zero")
    name, config = parse_route(environment, hooks)
    definition = hooks.environments.get(name)
    with open_source(input_path) as source:
        check_distinct(input_path, output_path)
        with atomic_output(output_path) as sink:
            return _write_rows(definition, config, input_path, source, sink, limit=limit)


def convert(environment: str, input_path: str, output_path: str, *, limit: int | None = None) -> str:
    """What `relax-gym convert` does and prints."""
    output = Path(output_path)
    count = convert_file(make_plugin_manager(), environment, Path(input_path), output, limit=limit)
    return f"Converted {count} row(s) to {output}"
