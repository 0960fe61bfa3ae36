"""From a terminal snapshot to Relax's session output file (reference §5.5 step 6 and §5.6).

Only completed/truncated trials with a reward are exported. Anything else must fail the session so
Relax drops the group instead of scoring a half-finished trajectory with a local reward model.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from relax_gym_core.client.exceptions import RemoteTrialError
from relax_gym_core.errors import ProtocolError
from relax_gym_core.protocol import TrialSnapshot, TrialStatus, jsonutil

EXPORTABLE: Final = frozenset({TrialStatus.COMPLETED, TrialStatus.TRUNCATED})
SERVICE_RESTART: Final = "service_restart"  # the gateway restarted while the trial ran: its run is gone
# Error codes are identifiers; anything else (free text from an adapter) stays out of messages.
_CODE_RE: Final = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")


def _safe_code(error: dict[str, Any] | None, key: str = "code") -> str | None:
    value = error.get(key) if error else None
    return value if isinstance(value, str) and _CODE_RE.fullmatch(value) else None


def check_terminal(snapshot: TrialSnapshot) -> TrialSnapshot:
    """Return an exportable snapshot; raise RemoteTrialError for aborted/failed ones."""
    if snapshot.status in EXPORTABLE:
        return snapshot
    code = _safe_code(snapshot.error)
    if snapshot.status is TrialStatus.ABORTED:
        if code == SERVICE_RESTART:
            raise RemoteTrialError(
                "Remote trial was lost to a gateway restart (error code 'service_restart'): never scored",
                snapshot=snapshot,
            )
        suffix = f" (error code '{code}')" if code else ""
        raise RemoteTrialError(f"Remote trial was aborted{suffix}", snapshot=snapshot)
    if snapshot.status is TrialStatus.FAILED:
        # A cleanup failure keeps the original cause apart: it tells an agent error from a lost sandbox.
        # An infrastructure failure's kind says which (judge_failed, masked:..., verifier_error); its reason,
        # free text, stays in the snapshot and the gateway's log.
        cause = _safe_code(snapshot.error, "cause")
        kind = _safe_code(snapshot.error, "kind")
        named = ", ".join(f"{name} '{value}'" for name, value in (("kind", kind), ("cause", cause)) if value)
        suffix = f" ({named})" if named else ""
        raise RemoteTrialError(
            f"Remote trial failed with error code '{code or 'unknown'}'{suffix}", snapshot=snapshot
        )
    raise ProtocolError(f"Trial {snapshot.request_id} is not terminal (status {snapshot.status.value})")


def stop_reason(snapshot: TrialSnapshot) -> str:
    """Why the trial stopped, in the categories Relax's rollout logging buckets (`rollout_stop_reason`):
    completed, max_turns (the environment truncated the episode), budget_exhausted (its deadline), or
    env_error:<kind> (any other failure, by its kind or code)."""
    if snapshot.status is TrialStatus.COMPLETED:
        return "completed"
    if snapshot.status is TrialStatus.TRUNCATED:
        return "max_turns"
    kind = failure_kind(snapshot)
    return "budget_exhausted" if kind == "deadline_exceeded" else f"env_error:{kind}"


def failure_kind(snapshot: TrialSnapshot) -> str:
    """What ended a trial that did not finish on its own: its error's kind (an infrastructure failure's
    name), else its code, else its status."""
    error = snapshot.error or {}
    for key in ("kind", "code"):
        if isinstance(error.get(key), str):
            return str(error[key])
    return snapshot.status.value


# A trajectory's counts (the gateway's `counts`) that a trial line records and the output carries as numbers
# at the top of its metadata, where Relax's rollout logging takes every numeric key as a metric.
TRAJECTORY_COUNTS = ("answered_calls", "tool_calls", "tool_outputs", "input_tokens", "output_tokens")
LOGGED_COUNTS = ("model_calls", *TRAJECTORY_COUNTS)


def build_output(snapshot: TrialSnapshot, counts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Relax output object {"reward": ..., "metadata": {"nemo_gym": {...}, "rollout_stop_reason": ...,
    <counts>}} of an exportable trial; `counts` are its trajectory's (GET .../trajectory), when kept."""
    if snapshot.status not in EXPORTABLE:
        raise ProtocolError(f"Cannot materialize non-success terminal status: {snapshot.status.value}")
    if snapshot.reward is None:
        raise RemoteTrialError(
            f"NeMo Gym trial has no reward: request_id={snapshot.request_id} "
            f"status={snapshot.status.value} error_code={_safe_code(snapshot.error) or 'missing_reward'}",
            snapshot=snapshot,
        )
    reward: Any = snapshot.reward
    nemo_gym: dict[str, Any] = {
        "request_id": snapshot.request_id,
        "status": snapshot.status.value,
        "metrics": dict(snapshot.metrics),
    }
    if snapshot.artifact_ref is not None:
        nemo_gym["artifact_ref"] = snapshot.artifact_ref
    if snapshot.error:
        # Only identifiers survive: error messages may quote prompts, paths or credentials.
        kept = {
            key: snapshot.error[key] for key in ("code", "type") if isinstance(snapshot.error.get(key), str)
        }
        if kept:
            nemo_gym["error"] = kept
    if isinstance(reward, dict):
        scalar = reward.get("scalar")
        if isinstance(scalar, (int, float)) and not isinstance(scalar, bool):
            nemo_gym["reward_components"] = reward.get("components") or {}
            reward = float(scalar)
    if snapshot.cleanup is not None:
        nemo_gym["cleanup"] = snapshot.cleanup.value
    metadata: dict[str, Any] = {"nemo_gym": nemo_gym, "rollout_stop_reason": stop_reason(snapshot)}
    for key in LOGGED_COUNTS:
        value = (counts or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            metadata[key] = value
    return {"reward": reward, "metadata": metadata}


def write_output(path: str | os.PathLike[str], payload: Any) -> bool:
    """Atomically replace `path` with compact JSON. False if the session directory is already gone.

    Relax removes the IO directory when it cancels a session; writing then is pointless, not an error.
    On any other failure the temporary file is removed and the previous target is left untouched.
    """
    data = jsonutil.dumps(payload)  # before touching the disk: an unencodable payload changes nothing
    target = Path(path)
    tmp_name: str | None = None
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except FileNotFoundError:
        _discard(tmp_name)
        return False
    except BaseException:
        _discard(tmp_name)
        raise
    return True


def _discard(tmp_name: str | None) -> None:
    if tmp_name is not None:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
