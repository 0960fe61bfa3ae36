"""`make demo`: the main job, on the embedded default, for every installed environment.

1. The example rows each plugin bundles (the rows of its verifier probes), converted and tagged with
   `relax-gym mix` into one dataset.
2. `relax-gym rollout` of that dataset with `--policy oracle:0.3` and a few repeats: the command starts the
   environments' real NeMo Gym servers and a gateway in front of them on 127.0.0.1 (as `relax-gym up`
   does) and plays the policy with the oracle (each row's known-good trajectory, a known-bad one for 30 %
   of the trials, seeded), so no language model is needed; the live view shows progress.
3. `relax-gym report` of the run: one HTML file, printed at the end.

Every step is the real CLI in a subprocess, as a user would type it. The results stay in a directory
under the system's temporary directory, so the report can be opened afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from relax_gym_core.plugin.host import make_plugin_manager
from relax_gym_core.rollout.data import example_rows

POLICY = "oracle:0.3"
REPEATS = 3
CONCURRENCY = 8


def relax_gym(*args: str) -> None:
    """Run `relax-gym ARGS` with this interpreter; its output goes straight to the terminal."""
    print(f"$ relax-gym {' '.join(args)}", flush=True)
    completed = subprocess.run([sys.executable, "-m", "relax_gym_core.cli", *args], check=False)  # noqa: S603
    if completed.returncode != 0:
        raise SystemExit(f"demo: `relax-gym {args[0]}` failed (exit {completed.returncode})")


def write_examples(root: Path) -> list[str]:
    """One file of example rows per installed environment; the `ENV=FILE` arguments of `relax-gym mix`."""
    hooks = make_plugin_manager()
    sources = []
    for definition in hooks.environments:
        try:
            rows = example_rows(hooks, definition.name)
        except Exception as exc:  # noqa: BLE001 - one plugin's missing data must not end the demo
            print(f"   {definition.name}: no example rows ({exc})")
            continue
        if not rows:
            print(f"   {definition.name}: its plugin bundles no example rows")
            continue
        path = root / f"{definition.name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"   {definition.name}: {len(rows)} example rows")
        sources.append(f"{definition.name}={path}")
    return sources


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="relax-gym-demo-"))
    print(f"[1] the installed environments' example rows, mixed into one dataset ({root})")
    sources = write_examples(root)
    if not sources:
        print("no environment plugin with example rows is installed (see `relax-gym plugins`)")
        return 1
    data, run = root / "data.jsonl", root / "run"
    relax_gym("mix", "--output", str(data), *sources)
    print(
        f"\n[2] the rollout: every row {REPEATS} times against the oracle policy ({POLICY}), through the "
        "real NeMo Gym servers and gateway (their start takes a minute or two on 2 cores)"
    )
    relax_gym(
        "rollout", "--data", str(data), "--policy", POLICY, "--repeats", str(REPEATS),
        "--concurrency", str(CONCURRENCY), "--out", str(run),
    )  # fmt: skip
    print("\n[3] the report")
    relax_gym("report", str(run))
    report = run / "report.html"
    print(f"\nreport: file://{report}  (one self-contained file: open it in any browser)")
    print(f"trials: {run / 'trials.jsonl'}  summary: {run / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
