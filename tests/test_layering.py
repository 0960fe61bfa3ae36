"""The dependency rules that keep the tree readable: Relax imports the protocol and the thin client, so
they must not drag in the gateway's web stack; the trial state machine imports no HTTP framework."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

WEB = ("starlette", "uvicorn", "aiohttp", "pyreqwest", "relax_gym_core.gateway", "relax_gym_core.bridge")
HEAVY = ("torch", "sglang", "megatron")


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("relax_gym_core.protocol", (*WEB, "httpx", *HEAVY)),
        ("relax_gym_core.client", (*WEB, *HEAVY)),
        ("relax_gym_core.trials.book", (*WEB, "httpx", *HEAVY)),
        ("relax_gym_core.trials", ("starlette", "uvicorn", "relax_gym_core.gateway", *HEAVY)),
        ("relax_gym_core.environments", (*WEB, *HEAVY)),
        ("relax_gym_core.observe", (*WEB, "httpx", *HEAVY)),
    ],
)
def test_module_imports_stay_light(module: str, forbidden: tuple[str, ...]) -> None:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(result.stdout)
    offending = sorted(
        name for name in loaded if any(name == f or name.startswith(f + ".") for f in forbidden)
    )
    assert offending == []
