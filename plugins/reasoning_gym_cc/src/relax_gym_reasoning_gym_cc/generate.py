"""relax-gym-reasoning-gym-generate: a fresh reasoning-gym dataset, since the published one
(nvidia/Nemotron-RL-ReasoningGym-v1 on Hugging Face) is not reachable offline.

    relax-gym-reasoning-gym-generate --tasks basic_arithmetic,leg_counting --size 50 --seed 1 -o rows.jsonl

writes SIZE rows per task (task by task, in the order given), each ``reasoning_gym.create_dataset(task,
size=SIZE, seed=SEED)[i]`` as a raw NeMo Gym row: ``question``, ``answer``, ``metadata`` (with
``source_dataset``) and ``responses_create_params.input``, prompted as rows.py prompts a row without
one (prompts.py).
Feed it to `relax-gym convert reasoning_gym`. The same tasks, size and seed give the same file.

The reasoning-gym library (sympy, matplotlib, ...) lives in the NeMo Gym environment, as the verifier that
scores these rows does, and not in relax-gym's. Run anywhere else, this command runs itself again with
that environment's python (relax_gym_core.gym.installed.gym_python: $RELAX_GYM_NEMO_GYM_PYTHON, else
.gym/venv). So this module imports only the standard library, relax_gym_core.gym.installed (light: it
imports there too), this package's light data.py and prompts.py, and (lazily) reasoning_gym. Bad
arguments (an unknown task, a size below 1) exit 2 naming them, before the library loads (task names as
data.TASKS lists them, then as the library registers them); the output file is written whole or not at
all.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from relax_gym_core.errors import ConfigError
from relax_gym_core.gym.installed import gym_python

from relax_gym_reasoning_gym_cc.data import TASKS

NOT_A_TASK = frozenset({"composite"})  # reasoning-gym's mixer of other tasks, not a task of its own
EXIT_USAGE = 2


class GenerateError(Exception):
    """A refusal to report in one line (no traceback), exit 2."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="relax-gym-reasoning-gym-generate",
        description="Generate raw reasoning_gym rows with the reasoning-gym library (for relax-gym convert).",
    )
    parser.add_argument("--tasks", required=True, help="comma-separated reasoning-gym task names")
    parser.add_argument("--size", type=int, required=True, help="rows per task")
    parser.add_argument("--seed", type=int, default=42, help="seed of every task's generator (default 42)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the JSONL file to write")
    return parser.parse_args(argv)


def task_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise GenerateError("--tasks names no task")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise GenerateError(f"--tasks names {', '.join(repeated)} more than once")
    return names


def check_tasks(names: Sequence[str], known: Collection[str]) -> None:
    valid = sorted(set(known) - NOT_A_TASK)
    unknown = [name for name in names if name not in valid]
    if unknown:
        listed, choices = ", ".join(unknown), ", ".join(valid)
        raise GenerateError(
            f"--tasks: unknown reasoning-gym task(s): {listed}. Valid tasks ({len(valid)}): {choices}"
        )


def raw_row(entry: dict[str, Any]) -> dict[str, Any]:
    from relax_gym_reasoning_gym_cc.prompts import prompt  # noqa: PLC0415 - stdlib only

    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt(entry["question"])}]},
        "question": entry["question"],
        "answer": entry["answer"],
        "metadata": entry["metadata"],
    }


def generate(names: Sequence[str], size: int, seed: int) -> list[str]:
    """The JSONL lines: `size` rows of every task in `names` (run where reasoning_gym is importable)."""
    # Some of reasoning-gym's dependencies (cellpylib) warn about their own code when compiled: noise here.
    warnings.filterwarnings("ignore", category=SyntaxWarning)
    # The NeMo Gym environment's library (untyped, absent where mypy runs): imported by name.
    reasoning_gym = importlib.import_module("reasoning_gym")

    check_tasks(names, reasoning_gym.factory.DATASETS)  # the library itself has the last word
    lines: list[str] = []
    for name in names:
        try:
            dataset = reasoning_gym.create_dataset(name, size=size, seed=seed)
            entries = [dataset[index] for index in range(size)]
        except Exception as exc:  # noqa: BLE001 - whatever a task's generator raises, reported by task
            raise GenerateError(f"task {name}: reasoning-gym failed ({type(exc).__name__}: {exc})") from None
        for index, entry in enumerate(entries):
            try:
                lines.append(json.dumps(raw_row(entry), ensure_ascii=False, allow_nan=False))
            except (TypeError, ValueError) as exc:
                raise GenerateError(f"task {name} row {index}: not writable as JSON ({exc})") from None
    return lines


def write_whole(path: Path, lines: Sequence[str]) -> None:
    """All lines or nothing: a temporary file next to `path`, renamed over it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise GenerateError(f"-o {path}: cannot write there ({exc.strerror})") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in lines)
        Path(temporary).replace(path)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise GenerateError(f"-o {path}: cannot write there ({exc.strerror})") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def checked_tasks(args: argparse.Namespace) -> list[str]:
    """The task names, once every argument is known good (before the library loads: it takes seconds)."""
    names = task_names(args.tasks)
    if args.size < 1:
        raise GenerateError(f"--size must be at least 1, got {args.size}")
    check_tasks(names, TASKS)
    return names


def in_gym_environment(arguments: Sequence[str]) -> int:
    """The same command, in the environment that has the library (its exit code is ours)."""
    try:
        python = gym_python()
    except ConfigError as exc:
        raise GenerateError(
            f"the reasoning-gym library is not installed here but in the NeMo Gym environment (with this "
            f"plugin): {exc}"
        ) from None
    command = [python, "-m", "relax_gym_reasoning_gym_cc.generate", *arguments]
    return subprocess.run(command, check=False).returncode  # noqa: S603 - our own module


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(arguments)
    try:
        names = checked_tasks(args)
        if importlib.util.find_spec("reasoning_gym") is None:
            return in_gym_environment(arguments)
        lines = generate(names, args.size, args.seed)
        write_whole(args.output, lines)
    except GenerateError as exc:
        print(f"relax-gym-reasoning-gym-generate: error: {exc}", file=sys.stderr)  # noqa: T201
        return EXIT_USAGE
    done = f"{len(lines)} row(s) ({len(names)} task(s) x {args.size}, seed {args.seed})"
    print(f"Wrote {done} to {args.output}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
