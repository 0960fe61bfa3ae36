"""`relax-gym-r2e-prepare`: R2E-Gym rows -> everything the production path needs (no Ray, no Apptainer).

    relax-gym-r2e-prepare --input r2e_gym_lite.jsonl --output-dir /data/r2e --split train \\
        --sif-dir /data/r2e/sifs --deadline-s 5460 --agent-url http://GYM:28101 --gateway-url http://GYM:28100

writes into the output directory (each file atomically; nothing is written when a row is refused):

- ``r2e_gym_<split>.jsonl``: NeMo Gym rows for swe_agents (what `relax-gym convert r2e_gym` reads);
- ``r2e_gym_<split>_relax.jsonl``: the Relax rows (problem statement as the prompt), a preview;
- ``r2e_gym_<split>_sifs.jsonl``: the image manifest (instance_id, docker_image, sif_name, sif_path) to
  build each SIF with ``apptainer build <sif_path> docker://<docker_image>``;
- ``r2e_gym_swe_agents.yaml``: the swe_agents server config (JSON, which YAML reads);
- ``r2e_gym_environments.json``: the gateway's environments file (``relax-gym serve --environments``);

and prints the Relax flags. A row that is inconsistent is refused as ``<file>:<line>: <field> ...``; a
deadline the timeouts do not fit in is refused with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from relax_gym_core.errors import ConfigError
from relax_gym_core.plugin import RowError

from relax_gym_r2e import rows
from relax_gym_r2e.plugin import R2E_GYM
from relax_gym_r2e.production import DEFAULT_DATASET, ProductionPlan


def _write_atomically(path: Path, lines: Iterable[str]) -> None:
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            for line in lines:
                out.write(line + "\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_rows(path: Path, limit: int | None) -> list[tuple[int, dict[str, Any]]]:
    found: list[tuple[int, dict[str, Any]]] = []
    with path.open(encoding="utf-8") as source:
        for number, line in enumerate(source, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise RowError(f"{path}:{number}: not valid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise RowError(f"{path}:{number}: a row must be a JSON object")
            found.append((number, row))
            if limit is not None and len(found) >= limit:
                break
    return found


def prepare(
    source: Path, output_dir: Path, *, split: str, plan: ProductionPlan, limit: int | None = None
) -> dict[str, Path]:
    """Prepare every row (all or nothing) and write the files; returns them by kind."""
    prepared: list[dict[str, Any]] = []
    relax: list[dict[str, Any]] = []
    manifest: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for number, row in read_rows(source, limit):
        where = f"{source}:{number}"
        try:
            instance = rows.r2e_instance(row)
            nemo_row = rows.prepare_row(row, dataset_name=plan.dataset_name, split=split)
            relax.append(R2E_GYM.convert_row(nemo_row))
        except RowError as exc:
            raise RowError(f"{where}: {exc}") from None
        if instance.instance_id in seen:
            raise RowError(
                f"{where}: instance_id {instance.instance_id!r} repeats line {seen[instance.instance_id]}"
            )
        seen[instance.instance_id] = number
        prepared.append(nemo_row)
        sif_name = f"{plan.sif_prefix}{instance.sif_name}"
        manifest.append(
            {
                "instance_id": instance.instance_id,
                "docker_image": row["docker_image"],
                "sif_name": sif_name,
                "sif_path": f"{plan.sif_dir.rstrip('/')}/{sif_name}",
            }
        )
    if not prepared:
        raise RowError(f"{source}: no rows")
    output_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "rows": output_dir / f"r2e_gym_{split}.jsonl",
        "relax": output_dir / f"r2e_gym_{split}_relax.jsonl",
        "manifest": output_dir / f"r2e_gym_{split}_sifs.jsonl",
        "swe_agents": output_dir / "r2e_gym_swe_agents.yaml",
        "environments": output_dir / "r2e_gym_environments.json",
    }
    _write_atomically(files["rows"], (json.dumps(row) for row in prepared))
    _write_atomically(files["relax"], (json.dumps(row) for row in relax))
    _write_atomically(files["manifest"], (json.dumps(entry) for entry in manifest))
    _write_atomically(files["swe_agents"], [json.dumps(plan.swe_agents_config(), indent=2)])
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="relax-gym-r2e-prepare", description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, required=True, help="R2E-Gym rows (JSONL)")
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--dataset-name", default=DEFAULT_DATASET)
    parser.add_argument("--sif-dir", required=True, help="absolute directory of the instances' SIF images")
    parser.add_argument("--sif-prefix", default="")
    parser.add_argument("--agent-timeout-s", type=int, default=3600)
    parser.add_argument("--tests-timeout-s", type=int, default=1800)
    parser.add_argument(
        "--cleanup-grace-s", type=float, default=float(os.environ.get("NEMO_GYM_CLEANUP_GRACE_S", "30"))
    )
    parser.add_argument("--deadline-s", type=float, default=5460.0, help="the client's NEMO_GYM_DEADLINE_S")
    parser.add_argument("--max-deadline-s", type=float, default=7200.0)
    parser.add_argument("--lease-s", type=float, default=120.0)
    parser.add_argument("--max-turns", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--agent-url", default="http://127.0.0.1:28101", help="the swe_agents server")
    parser.add_argument("--gateway-url", default="http://127.0.0.1:28100")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    try:
        plan = ProductionPlan(
            sif_dir=args.sif_dir,
            sif_prefix=args.sif_prefix,
            dataset_path=str((args.output_dir / f"r2e_gym_{args.split}.jsonl").absolute()),
            dataset_name=args.dataset_name,
            agent_timeout_s=args.agent_timeout_s,
            tests_timeout_s=args.tests_timeout_s,
            cleanup_grace_s=args.cleanup_grace_s,
            deadline_s=args.deadline_s,
            max_deadline_s=args.max_deadline_s,
            lease_s=args.lease_s,
            max_turns=args.max_turns,
            concurrency=args.concurrency,
            queue_capacity=2 * args.concurrency,
        )
        files = prepare(args.input, args.output_dir, split=args.split, plan=plan, limit=args.limit)
        _write_atomically(files["environments"], [json.dumps(plan.environments(args.agent_url), indent=2)])
    except (RowError, ConfigError, OSError) as exc:
        print(f"relax-gym-r2e-prepare: {exc}", file=sys.stderr)  # noqa: T201 - the CLI's error line
        return 2
    count = len(files["rows"].read_text(encoding="utf-8").splitlines())
    print(f"prepared {count} R2E-Gym row(s) into {args.output_dir}")  # noqa: T201
    for kind, path in files.items():
        print(f"  {kind}: {path}")  # noqa: T201
    print("Relax flags:\n  " + " ".join(plan.relax_flags(args.gateway_url)))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
