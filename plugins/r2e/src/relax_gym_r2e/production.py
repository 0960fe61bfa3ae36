"""The production path (configuration, validated here, not run here): NeMo Gym's swe_agents with OpenHands
and Apptainer, R2E-Gym's evaluator, behind `relax-gym serve`.

``ProductionPlan`` holds every number that must agree across the three processes, and refuses at
configuration time what would repeat the seed's defect (its client deadline, 1200 s, was far below the
agent's 3600 s + the tests' 1800 s, so long trajectories were truncated without a reward and their
Apptainer sandboxes leaked): a trial deadline shorter than agent timeout + tests timeout + cleanup
grace is refused with the numbers in the message. From it come

- ``swe_agents_config()``: the NeMo Gym config of the swe_agents server (SIF directory and prefix, the
  R2E harness, timeouts, memory, concurrency);
- ``environments()``: the gateway's environments file entry for ``r2e-gym-v1``;
- ``relax_flags()``: the thin client's Relax flags (deadline, lease, agent timeout = deadline + 60 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from relax_gym_core.errors import ConfigError
from relax_gym_core.plugin import POLICY_MODEL

from relax_gym_r2e.plugin import R2E_GYM

ENVIRONMENT = R2E_GYM.name
CONFIG = R2E_GYM.configs[0]
AGENT = "swe_agents"
# swe_agents (nemo-gym 0.4.0) picks its R2E-Gym harness when the dataset name contains this; there is no
# separate harness key upstream (the seed's `dataset_harness=r2e_gym` came from its own patch).
R2E_HARNESS_MARKER = "R2E-Gym"
DEFAULT_DATASET = "R2E-Gym/R2E-Gym-Lite"
CLIENT_MARGIN_S = 60.0  # Relax's --agent-timeout outlives the trial by this much (the reference's rule)


@dataclass(frozen=True)
class DeadlinePolicy:
    """A trial must be able to outlive its agent, its tests and the cleanup after them."""

    agent_timeout_s: float
    tests_timeout_s: float
    cleanup_grace_s: float

    @property
    def minimum_deadline_s(self) -> float:
        return self.agent_timeout_s + self.tests_timeout_s + self.cleanup_grace_s

    def check(self, deadline_s: float, *, what: str = "trial deadline") -> None:
        if not math.isfinite(deadline_s) or deadline_s < self.minimum_deadline_s:
            raise ConfigError(
                f"{what} {deadline_s:g} s is shorter than agent timeout {self.agent_timeout_s:g} s + tests "
                f"timeout {self.tests_timeout_s:g} s + cleanup grace {self.cleanup_grace_s:g} s = "
                f"{self.minimum_deadline_s:g} s: trajectories that use their budget would be cut off "
                "without a reward and their sandboxes left running. Raise the deadline to at least "
                f"{self.minimum_deadline_s:g} s or lower the timeouts"
            )


@dataclass(frozen=True)
class ProductionPlan:
    sif_dir: str
    dataset_path: str
    sif_prefix: str = ""
    dataset_name: str = DEFAULT_DATASET
    agent_timeout_s: int = 3600  # swebench_agent_timeout
    tests_timeout_s: int = 1800  # swebench_tests_timeout
    cleanup_grace_s: float = 30.0  # the gateway's NEMO_GYM_CLEANUP_GRACE_S
    deadline_s: float = 5460.0  # the client's NEMO_GYM_DEADLINE_S
    max_deadline_s: float = 7200.0  # the gateway spec's cap
    lease_s: float = 120.0
    max_turns: int = 50
    concurrency: int = 64  # >= resident groups x samples per prompt (8 x 8 in the reference recipe)
    queue_capacity: int = 128
    memory_limit_mb: int = 32768
    command_exec_timeout_s: int = 300

    def __post_init__(self) -> None:
        if not self.sif_dir.startswith("/"):
            raise ConfigError(f"sif_dir must be an absolute path (got {self.sif_dir!r})")
        if "/" in self.sif_prefix:
            raise ConfigError(f"sif_prefix must not contain '/' (got {self.sif_prefix!r}); use sif_dir")
        if R2E_HARNESS_MARKER not in self.dataset_name:
            raise ConfigError(
                f"dataset_name {self.dataset_name!r} must contain {R2E_HARNESS_MARKER!r}: swe_agents "
                "chooses the R2E-Gym harness (and its SIF lookup) by that name"
            )
        for name in ("agent_timeout_s", "tests_timeout_s", "max_turns", "concurrency", "memory_limit_mb"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)!r})")
        self.policy.check(self.deadline_s, what="trial deadline (NEMO_GYM_DEADLINE_S)")
        if self.max_deadline_s < self.deadline_s:
            raise ConfigError(
                f"the gateway's max_deadline_s {self.max_deadline_s:g} s is below the trial deadline "
                f"{self.deadline_s:g} s: every trial would be refused (HTTP 400)"
            )
        if not 0 < self.lease_s < self.deadline_s:
            raise ConfigError(f"lease_s {self.lease_s:g} must be positive and below the deadline")

    @property
    def policy(self) -> DeadlinePolicy:
        return DeadlinePolicy(
            agent_timeout_s=self.agent_timeout_s,
            tests_timeout_s=self.tests_timeout_s,
            cleanup_grace_s=self.cleanup_grace_s,
        )

    @property
    def container_formatter(self) -> str:
        # swe_agents substitutes "<repo lower>_final_<commit>" for {instance_id} for R2E-Gym rows.
        return f"{self.sif_dir.rstrip('/')}/{self.sif_prefix}{{instance_id}}.sif"

    def swe_agents_config(self) -> dict[str, Any]:
        """The swe_agents server's NeMo Gym config (merge with upstream's swebench_openhands.yaml)."""
        return {
            AGENT: {
                "responses_api_agents": {
                    "swe_agents": {
                        "entrypoint": "app.py",
                        "model_server": {"type": "responses_api_models", "name": POLICY_MODEL},
                        "agent_max_turns": self.max_turns,
                        "container_formatter": self.container_formatter,
                        "dataset_path": self.dataset_path,
                        "swebench_agent_timeout": self.agent_timeout_s,
                        "swebench_tests_timeout": self.tests_timeout_s,
                        "apptainer_memory_limit_mb": self.memory_limit_mb,
                        "command_exec_timeout": self.command_exec_timeout_s,
                        "concurrency": self.concurrency,
                    }
                }
            }
        }

    def environments(self, agent_url: str) -> dict[str, Any]:
        """The gateway's environments file ({config: spec}). swe_agents offers no cleanup route, so a
        cancelled trial ends cleanup_unverified (honest: an Apptainer job is not proven stopped)."""
        return {
            CONFIG: {
                "environment": ENVIRONMENT,
                "agent_name": AGENT,
                "agent_url": agent_url,
                "interrupt_policy": "protected",
                "max_concurrency": self.concurrency,
                "queue_capacity": self.queue_capacity,
                "max_deadline_s": self.max_deadline_s,
                "readiness_urls": [agent_url],
            }
        }

    @property
    def agent_timeout_flag_s(self) -> int:
        return math.ceil(self.deadline_s + CLIENT_MARGIN_S)

    def relax_flags(self, gateway_url: str) -> list[str]:
        """The thin client's part of the Relax command line."""
        return [
            "--use-agentic-rollout",
            "--agent-command",
            "relax-gym-client",
            "--agent-timeout",
            str(self.agent_timeout_flag_s),
            "--agent-env",
            f"NEMO_GYM_URL={gateway_url}",
            f"NEMO_GYM_ENVIRONMENT={ENVIRONMENT}",
            f"NEMO_GYM_CONFIG={CONFIG}",
            "NEMO_GYM_MODEL=model",
            "NEMO_GYM_INTERRUPT_POLICY=protected",
            f"NEMO_GYM_DEADLINE_S={self.deadline_s:g}",
            f"NEMO_GYM_LEASE_S={self.lease_s:g}",
            "--input-key",
            "input",
            "--metadata-key",
            "metadata",
        ]
