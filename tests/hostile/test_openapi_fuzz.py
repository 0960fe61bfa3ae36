"""The published OpenAPI document describes the gateway well enough for a fuzzer to drive it.

The case: /openapi.json omitted the model-call routes, /metrics, the 401s and every field rule, so a
fuzzer driven by it never created a trial. Here Schemathesis, given only the document's URL, runs its
examples and fuzzing phases (bounded) against a real `relax-gym serve` process; every check but
positive-data acceptance must pass (the document states the protocol's rules, while a gateway also
refuses what its configuration does not allow, such as a callback host outside its allowlist).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from .conftest import ECHO, SAFETY_S, gateway_with

TOKEN = "fuzz-token-0123456789abcdef"
CONFIG = Path(__file__).with_name("schemathesis.toml")
SCHEMATHESIS = Path(sys.executable).with_name("st")


def test_schemathesis_driven_by_the_published_document_passes_and_creates_trials(tmp_path: Path) -> None:
    specs = {"echo": {**ECHO["echo"], "queue_capacity": 256}}
    with gateway_with({"RELAX_GYM_API_TOKEN": TOKEN}, specs=specs) as gateway:
        result = subprocess.run(
            [
                str(SCHEMATHESIS),
                "--config-file",
                str(CONFIG),
                "run",
                f"{gateway.url}/openapi.json",
                *("--phases", "examples,fuzzing"),
                *("--max-examples", "5"),
                *("--workers", "1"),
                *("--checks", "all"),
                *("--exclude-checks", "positive_data_acceptance"),
                *("--header", f"Authorization: Bearer {TOKEN}"),
                *("--request-timeout", "10"),
                *("--generation-database", "none"),
                *("--seed", "20240601"),
                "--no-shrink",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=4 * SAFETY_S,
            cwd=tmp_path,  # its reports, if any, stay out of the tree
            check=False,
        )
        health = httpx.get(f"{gateway.url}/healthz", trust_env=False, timeout=SAFETY_S).json()
        server_errors = [line for line in gateway.output if "unhandled error" in line]
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert health["trials"] >= 1  # the document's own example created one
    assert server_errors == []
