"""r2e_gym rows: R2E-Gym rows -> NeMo Gym rows (the seed's prepare_r2e_gym), their checks, and the rows of
the bundled tasks.

Two NeMo Gym row shapes reach this environment, both prepared here from R2E-Gym rows:

- swe_agents (production): ``responses_create_params = {input: [], metadata: {instance_id, base_commit,
  dataset_name, split, problem_statement, instance_dict (JSON string)}, model, temperature, top_p,
  max_output_tokens}``, ``agent_ref`` swe_agents, and top-level ``instance_id``, ``repo_name``,
  ``docker_image``, ``commit_hash``, ``problem_statement``. Relax's prompt is the problem statement (the
  reference converter's R2E rule) and the /run body restores the empty agent input.
- local (``localize``): the prompt (problem statement plus how the tools work) as the input, the local
  tools, and ``base_commit`` / ``dataset_name`` / ``split`` at the top level, where the resources server
  reads them.

The environment checks both before the reference converts them, and again in their /run bodies
(relax_gym_r2e.plugin). Inconsistent rows raise RowError naming the field (`relax-gym convert` adds
file:line; the prepare tool adds the row number).

The bundled tasks' rows (``example_rows``) are R2E-Gym shaped rows made from the tasks, prepared the way
production prepares its rows (``prepare_row``), then localised.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from relax_gym_core.plugin import RowError

from relax_gym_r2e import tasks, toolspecs

R2E_FIELDS = ("repo_name", "docker_image", "commit_hash", "problem_statement", "parsed_commit_content")
METADATA_FIELDS = (
    "instance_id",
    "base_commit",
    "dataset_name",
    "split",
    "problem_statement",
    "instance_dict",
)
DOCKER_IMAGE = re.compile(r"(?P<owner>[^/\s:]+)/(?P<repo>[^/\s:]+)_final:(?P<commit>[0-9a-f]{7,40})")
INSTANCE_ID = re.compile(r"(?P<owner>[^_\s/]+)__(?P<repo>[^-\s/]+)-(?P<commit>[0-9a-f]{7,40})")
COMMIT = re.compile(r"[0-9a-f]{7,40}")
BASE = re.compile(r"[0-9a-f]{7,40}\^?")  # a commit, or the seed's fallback "<commit_hash>^"
SAMPLING = {"model": "model", "temperature": 0.7, "top_p": 0.8, "max_output_tokens": 32768}
SWE_AGENTS_REF = {"type": "responses_api_agents", "name": "swe_agents"}


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _string(row: Mapping[str, Any], field: str, where: str = "") -> str:
    value = row.get(field)
    if not isinstance(value, str) or not value.strip():
        raise RowError(f"{where}{field} must be a non-empty string, not {_type_name(value)}")
    return value


@dataclass(frozen=True)
class Instance:
    """What the R2E harness derives from a row: ids, the base commit, the Apptainer image's file name."""

    instance_id: str
    owner: str
    repo: str
    commit: str
    base_commit: str

    @property
    def sif_name(self) -> str:
        return f"{self.repo.lower()}_final_{self.commit}.sif"


def r2e_instance(row: Mapping[str, Any]) -> Instance:
    """Check an R2E-Gym row and derive its instance (RowError naming the field otherwise)."""
    for field in R2E_FIELDS:
        _string(row, field)
    image = row["docker_image"]
    match = DOCKER_IMAGE.fullmatch(image)
    if match is None:
        raise RowError(f"docker_image {image!r} is not '<owner>/<repo>_final:<hex commit>'")
    owner, repo, commit = match["owner"], match["repo"], match["commit"]
    # swe_agents turns the instance id back into the image file name with r"[^_]+__([^-]+)-": an owner
    # with "_" or a repo with "-" would name another file ("No container file found").
    if "_" in owner:
        raise RowError(f"docker_image owner {owner!r} contains '_': swe_agents could not find its SIF")
    if "-" in repo:
        raise RowError(f"docker_image repo {repo!r} contains '-': swe_agents could not find its SIF")
    if commit != row["commit_hash"]:
        raise RowError(f"docker_image commit {commit!r} differs from commit_hash {row['commit_hash']!r}")
    try:
        parsed = json.loads(row["parsed_commit_content"])
    except ValueError as exc:
        raise RowError(f"parsed_commit_content is not JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise RowError(f"parsed_commit_content must be a JSON object, not {_type_name(parsed)}")
    new = parsed.get("new_commit_hash")
    if new is not None and new != commit:
        raise RowError(f"parsed_commit_content.new_commit_hash {new!r} differs from commit_hash {commit!r}")
    old = parsed.get("old_commit_hash")
    if old is not None and (not isinstance(old, str) or not COMMIT.fullmatch(old)):
        raise RowError(f"parsed_commit_content.old_commit_hash {old!r} is not a hex commit")
    # commit_hash is the FIX commit: the agent starts from its parent (the seed's PITFALL 8.5.4).
    base = old if isinstance(old, str) else f"{commit}^"
    return Instance(
        instance_id=f"{owner}__{repo}-{commit}", owner=owner, repo=repo, commit=commit, base_commit=base
    )


def prepare_row(row: Mapping[str, Any], *, dataset_name: str, split: str) -> dict[str, Any]:
    """An R2E-Gym row -> the NeMo Gym row swe_agents runs (the seed's prepare_r2e_gym.py)."""
    instance = r2e_instance(row)
    instance_dict = {
        **copy.deepcopy(dict(row)),
        "instance_id": instance.instance_id,
        "repo": row["repo_name"],
        "version": row["commit_hash"],
        "base_commit": instance.base_commit,
    }
    return {
        "responses_create_params": {
            "input": [],
            "metadata": {
                "instance_id": instance.instance_id,
                "base_commit": instance.base_commit,
                "dataset_name": dataset_name,
                "split": split,
                "problem_statement": row["problem_statement"],
                "instance_dict": json.dumps(instance_dict),
            },
            **SAMPLING,
        },
        "agent_ref": dict(SWE_AGENTS_REF),
        "instance_id": instance.instance_id,
        "repo_name": row["repo_name"],
        "docker_image": row["docker_image"],
        "commit_hash": row["commit_hash"],
        "problem_statement": row["problem_statement"],
    }


def localize(row: Mapping[str, Any]) -> dict[str, Any]:
    """A swe_agents row -> the local runtime's row: prompt and tools in the params, the instance fields
    the resources server reads at the top level (nothing big rides along on every model call)."""
    check_row(row)
    metadata = row["responses_create_params"]["metadata"]
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": toolspecs.prompt(row["problem_statement"])}],
            "tools": toolspecs.tools(),
            "parallel_tool_calls": False,
        },
        "instance_id": row["instance_id"],
        "repo_name": row["repo_name"],
        "docker_image": row["docker_image"],
        "commit_hash": row["commit_hash"],
        "problem_statement": row["problem_statement"],
        "base_commit": metadata["base_commit"],
        "dataset_name": metadata["dataset_name"],
        "split": metadata["split"],
    }


# ---- checking NeMo Gym rows -------------------------------------------------------------------------------


def _check_swe_metadata(row: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
    where = "responses_create_params.metadata."
    for field in METADATA_FIELDS:
        _string(metadata, field, where)
    if metadata["instance_id"] != row["instance_id"]:
        raise RowError(
            f"{where}instance_id {metadata['instance_id']!r} differs from instance_id {row['instance_id']!r}"
        )
    if not BASE.fullmatch(metadata["base_commit"]):
        raise RowError(f"{where}base_commit {metadata['base_commit']!r} is not a hex commit")
    try:
        instance = json.loads(metadata["instance_dict"])
    except ValueError as exc:
        raise RowError(f"{where}instance_dict is not JSON ({exc})") from None
    if not isinstance(instance, dict):
        raise RowError(f"{where}instance_dict must encode a JSON object, not {_type_name(instance)}")
    for field in ("instance_id", "base_commit"):
        if instance.get(field) != metadata[field]:
            raise RowError(
                f"{where}instance_dict.{field} {instance.get(field)!r} differs from {where}{field}"
            )


def _check_local(row: Mapping[str, Any], params: Mapping[str, Any]) -> None:
    base = _string(row, "base_commit")
    if not COMMIT.fullmatch(base):
        raise RowError(f"base_commit {base!r} is not a hex commit (the local runtime checks out exactly it)")
    _string(row, "repo_name")
    messages = params.get("input")
    if not isinstance(messages, list) or not messages:
        raise RowError("responses_create_params.input must be a non-empty messages array (the prompt)")
    tools = params.get("tools")
    names = (
        {tool.get("name") for tool in tools if isinstance(tool, dict)} if isinstance(tools, list) else set()
    )
    if not names >= toolspecs.TOOL_NAMES:
        missing = ", ".join(sorted(toolspecs.TOOL_NAMES - names))
        raise RowError(f"responses_create_params.tools must list the r2e_gym tools (missing: {missing})")


def check_row(row: Mapping[str, Any]) -> str:
    """Check a NeMo Gym r2e_gym row (or /run body); returns its shape, "swe_agents" or "local"."""
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        raise RowError(f"responses_create_params must be an object, not {_type_name(params)}")
    instance_id = _string(row, "instance_id")
    match = INSTANCE_ID.fullmatch(instance_id)
    if match is None:
        raise RowError(f"instance_id {instance_id!r} is not '<owner>__<repo>-<hex commit>'")
    _string(row, "problem_statement")
    commit = row.get("commit_hash")
    if commit is not None and commit != match["commit"]:
        raise RowError(f"commit_hash {commit!r} differs from the commit of instance_id {instance_id!r}")
    metadata = params.get("metadata")
    if isinstance(metadata, dict) and "instance_dict" in metadata:
        _check_swe_metadata(row, metadata)
        if not isinstance(params.get("input"), list):
            raise RowError("responses_create_params.input must be a messages array (empty for swe_agents)")
        return "swe_agents"
    _check_local(row, params)
    return "local"


# ---- the bundled tasks' rows -------------------------------------------------------------------------------


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
        localize(prepare_row(row, dataset_name=tasks.DATASET_NAME, split=tasks.SPLIT)) for row in r2e_rows()
    ]


def example_row(name: str) -> dict[str, Any]:
    """The local row of bundled task `name`."""
    for row in example_rows():
        if row["repo_name"] == name:
            return row
    raise KeyError(f"no bundled task {name!r} (there are: {', '.join(sorted(tasks.load_tasks()))})")
