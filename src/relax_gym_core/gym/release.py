"""Which NeMo Gym the servers run: its version, where it was installed from (an index's wheel, or a source
tree), its commit, and whether it has observability (agents that prefix their model calls by rollout id).

Asked of the NeMo Gym environment's python once, with a standard-library script: importing NeMo Gym
takes seconds, reading its metadata does not. `relax-gym up` refuses --nemo-gym-observability for a NeMo
Gym without it and reports the release in /readyz; `relax-gym plugins` prints it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from relax_gym_core.errors import ConfigError

OBSERVABILITY_KEY = "observability_enabled"  # NeMo Gym >= 0.5's global config key (nemo_gym/global_config.py)
CAPTURE_DIR_KEY = "model_call_capture_dir"  # required with it by NeMo Gym's model servers (absolute path)
OBSERVABILITY_VAR = "RELAX_GYM_NEMO_GYM_OBSERVABILITY"

_SCRIPT = """
import importlib.metadata, importlib.util, json, pathlib, subprocess, sys, urllib.parse
dist = importlib.metadata.distribution("nemo-gym")
direct = json.loads(dist.read_text("direct_url.json") or "{}")
url = direct.get("url")
commit = (direct.get("vcs_info") or {}).get("commit_id")
if commit is None and url and url.startswith("file://"):
    try:
        done = subprocess.run(
            ["git", "-C", urllib.parse.unquote(urllib.parse.urlsplit(url).path), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10,
        )
        commit = done.stdout.strip() or None if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
spec = importlib.util.find_spec("nemo_gym")  # a top-level package: found, not imported
config = pathlib.Path(spec.origin).parent / "global_config.py" if spec and spec.origin else None
observability = bool(config and config.is_file() and sys.argv[1] in config.read_text())
json.dump({"version": dist.version, "source": url or "index", "commit": commit,
           "observability": observability}, sys.stdout)
"""


@frozen(kw_only=True)
class NemoGymRelease:
    """One NeMo Gym installation, as /readyz and `relax-gym plugins --json` report it."""

    version: str
    source: str  # "index" (a wheel from a package index, e.g. PyPI), else the URL it was installed from
    commit: str | None  # known for a VCS install or a git checkout; None for an index's wheel
    observability: bool  # whether its agents can prefix model calls by rollout id (NeMo Gym >= 0.5)

    def describe(self) -> str:
        where = "PyPI/index wheel" if self.source == "index" else f"from {self.source}"
        commit = f", commit {self.commit}" if self.commit else ""
        observability = "has observability" if self.observability else "no observability"
        return f"NeMo Gym {self.version} ({where}{commit}; {observability})"

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "source": self.source,
            "commit": self.commit,
            "observability": self.observability,
        }


def nemo_gym_release(python: str) -> NemoGymRelease:
    """What the NeMo Gym environment at `python` has installed, or a ConfigError saying why not."""
    try:
        done = subprocess.run(  # noqa: S603 - the configured NeMo Gym interpreter, a fixed script
            [python, "-c", _SCRIPT, OBSERVABILITY_KEY],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"the NeMo Gym environment's python {python} could not be run ({exc})") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no error output"])[-1]
        raise ConfigError(f"{python} has no usable nemo-gym installation ({tail}); create it with `make gym`")
    found = json.loads(done.stdout)
    return NemoGymRelease(
        version=str(found["version"]),
        source=str(found["source"]),
        commit=found["commit"] if isinstance(found["commit"], str) else None,
        observability=found["observability"] is True,
    )


def observability_wanted(flag: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """--nemo-gym-observability, else $RELAX_GYM_NEMO_GYM_OBSERVABILITY (1/true/yes or 0/false/no/empty)."""
    if flag:
        return True
    value = environ.get(OBSERVABILITY_VAR, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ConfigError(f"{OBSERVABILITY_VAR} must be 1 or 0 (got {value!r})")


def observability_config(release: NemoGymRelease, python: str) -> dict[str, Any]:
    """The global config keys that turn observability on, or a ConfigError for a NeMo Gym without it."""
    if not release.observability:
        raise ConfigError(
            f"--nemo-gym-observability: {release.describe()} at {python} has no observability (its agents "
            "never prefix model calls by rollout id; NeMo Gym >= 0.5 has it, e.g. the commit Relax pins, "
            "a85670eb). Without it the trial's tag in responses_create_params.metadata routes every call"
        )
    return {OBSERVABILITY_KEY: True}
