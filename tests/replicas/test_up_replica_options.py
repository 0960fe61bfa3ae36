"""`relax-gym up --replicas/--ray/--replica-resources`: bad values are one clear line naming the option,
exit code != 0, no stack trace, and nothing is started (the checks come before any server)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "0"], "--replicas must be at least 1 (got 0)"),
        (["--replica-resources", '{"CPU": 2}'], "--replica-resources applies to Ray replicas only"),
        (
            ["--ray", "127.0.0.1:1", "--replica-resources", "[2]"],
            "--replica-resources must be a non-empty JSON",
        ),
        (["--ray", "127.0.0.1:1", "--replica-resources", '{"CPU": -1}'], "'CPU' must be a positive number"),
        # Refused from the string alone: nothing is looked up or reached.
        (["--ray", "ray-head.example:6379"], "the replicas' agents call the gateway at --host"),
    ],
    ids=[
        "zero-replicas",
        "resources-without-ray",
        "resources-not-an-object",
        "negative-resource",
        "cluster-cannot-reach-a-loopback-gateway",
    ],
)
def test_bad_replica_options_are_one_clear_line(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "relax_gym_core.cli", "up", "workplace_assistant", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={
            **os.environ,
            "NEMO_GYM_CALLBACK_ALLOWED_NETWORKS": "127.0.0.1/32",
            "RELAX_GYM_STATE_DIR": ":memory:",
        },
    )
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert "starting NeMo Gym servers" not in result.stderr
