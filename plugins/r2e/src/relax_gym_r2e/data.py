"""Rows of the bundled tasks: R2E-Gym shaped raw rows, and the local runtime's NeMo Gym rows made from them
by the same preparation production uses (rows.prepare_row, then rows.localize)."""

from __future__ import annotations

import json
from typing import Any

from relax_gym_r2e import rows, tasks


def r2e_row(built: tasks.Built) -> dict[str, Any]:
    """A bundled task as an R2E-Gym dataset row (the fields the preparation reads)."""
    task = built.task
    return {
        "repo_name": task.repo_name,
        "docker_image": built.docker_image,
        "commit_hash": built.fix_commit,
        "problem_statement": task.problem_statement,
        "parsed_commit_content": json.dumps(
            {
                "old_commit_hash": built.base_commit,
                "new_commit_hash": built.fix_commit,
                "commit_message": f"{task.name}: fix the {task.bug_kind} bug",
            }
        ),
        "FAIL_TO_PASS": json.dumps(list(task.fail_to_pass)),
        "PASS_TO_PASS": json.dumps(list(task.pass_to_pass)),
    }


def r2e_rows() -> list[dict[str, Any]]:
    return [r2e_row(built) for built in tasks.built_tasks().values()]


def example_rows() -> list[dict[str, Any]]:
    """The local runtime's NeMo Gym rows, one per bundled task (fresh objects on every call)."""
    return [
        rows.localize(rows.prepare_row(row, dataset_name=tasks.DATASET_NAME, split=tasks.SPLIT))
        for row in r2e_rows()
    ]


def example_row(name: str) -> dict[str, Any]:
    """The local row of bundled task `name`."""
    for row in example_rows():
        if row["repo_name"] == name:
            return row
    raise KeyError(f"no bundled task {name!r} (there are: {', '.join(sorted(tasks.load_tasks()))})")
