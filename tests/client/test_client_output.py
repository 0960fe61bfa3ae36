"""Terminal mapping and the Relax output file (reference §5.5 step 6, §5.6)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from relax_gym_core.client import RemoteTrialError, build_output, check_terminal, write_output
from relax_gym_core.client import output as output_module
from relax_gym_core.errors import ProtocolError, TrialFailedError
from relax_gym_core.protocol import parse_snapshot

RID = "relax-abc"


@pytest.fixture
def snap(snapshot_json: Any) -> Any:
    def make(status: str = "completed", **fields: Any) -> Any:
        return parse_snapshot(snapshot_json(RID, status, **fields))

    return make


@pytest.mark.parametrize("status", ["completed", "truncated"])
def test_exportable_statuses_pass(snap: Any, status: str) -> None:
    snapshot = snap(status, reward=0.0)
    assert check_terminal(snapshot) is snapshot


def test_aborted_and_failed_are_errors_with_codes(snap: Any) -> None:
    with pytest.raises(RemoteTrialError, match=r"^Remote trial was aborted \(error code 'lease_expired'\)$"):
        check_terminal(snap("aborted", error={"code": "lease_expired"}))
    with pytest.raises(
        RemoteTrialError, match=r"^Remote trial failed with error code 'agent_error'$"
    ) as caught:
        check_terminal(snap("failed", error={"code": "agent_error"}))
    assert isinstance(caught.value, TrialFailedError)
    assert caught.value.snapshot.error == {"code": "agent_error"}
    cleanup = {"code": "cleanup_unverified", "type": "CleanupError", "cause": "deadline_exceeded"}
    with pytest.raises(
        RemoteTrialError, match=r"error code 'cleanup_unverified' \(cause 'deadline_exceeded'\)$"
    ):
        check_terminal(snap("failed", error=cleanup))


def test_free_text_codes_never_reach_messages(snap: Any) -> None:
    with pytest.raises(RemoteTrialError) as caught:
        check_terminal(snap("failed", error={"code": "Bearer sk-secret leaked in text"}))
    assert str(caught.value) == "Remote trial failed with error code 'unknown'"


def test_non_terminal_snapshot_is_refused(snap: Any) -> None:
    with pytest.raises(ProtocolError, match="not terminal"):
        check_terminal(snap("running"))
    with pytest.raises(ProtocolError, match="Cannot materialize non-success terminal status: aborted"):
        build_output(snap("aborted"))


def test_null_reward_guard(snap: Any) -> None:
    with pytest.raises(TrialFailedError) as caught:
        build_output(snap("truncated", error={"code": "deadline_exceeded"}))
    assert str(caught.value) == (
        f"NeMo Gym trial has no reward: request_id={RID} status=truncated error_code=deadline_exceeded"
    )
    with pytest.raises(TrialFailedError, match=r"status=completed error_code=missing_reward$"):
        build_output(snap("completed"))


@pytest.mark.parametrize("reward", [0.0, 1, 0.5, {"accuracy": 1.0, "format": 0.0}])
def test_rewards_pass_through(snap: Any, reward: Any) -> None:
    output = build_output(snap("truncated", reward=reward, metrics={"turns": 3}))
    assert output == {
        "reward": reward,
        "metadata": {
            "nemo_gym": {"request_id": RID, "status": "truncated", "metrics": {"turns": 3}},
            "rollout_stop_reason": "max_turns",  # truncated by the environment, in Relax's categories
        },
    }


def test_trajectory_counts_ride_as_numbers_relax_logs(snap: Any) -> None:
    counts = {"model_calls": 3, "answered_calls": 3, "tool_calls": 2, "tool_outputs": 2, "input_tokens": 90}
    output = build_output(snap(reward=1.0), {**counts, "output_tokens": None, "model_stop_reason": "stop"})
    metadata = output["metadata"]
    assert {key: metadata[key] for key in counts} == counts
    assert "output_tokens" not in metadata and "model_stop_reason" not in metadata  # numbers only
    assert metadata["rollout_stop_reason"] == "completed"
    # Relax's names for turns (its rollout dump's agent_turns is its rollout_turns: distinct responses on the
    # exported lineage) are never ours: a metric logged under one name keeps one meaning.
    assert not {"agent_turns", "rollout_turns", "num_turn", "turn_count"} & set(metadata)


def test_scalar_reward_is_unwrapped(snap: Any) -> None:
    output = build_output(snap(reward={"scalar": 1, "components": {"pass": 1, "style": 0.5}}))
    assert output["reward"] == 1.0
    assert isinstance(output["reward"], float)
    assert output["metadata"]["nemo_gym"]["reward_components"] == {"pass": 1, "style": 0.5}
    assert build_output(snap(reward={"scalar": 0.25}))["metadata"]["nemo_gym"]["reward_components"] == {}
    # A boolean scalar is not a number: the object passes through unchanged.
    assert build_output(snap(reward={"scalar": True}))["reward"] == {"scalar": True}


def test_metadata_keeps_only_safe_error_fields_and_extras(snap: Any) -> None:
    snapshot = snap(
        reward=0.5,
        artifact_ref="/var/relax-gym/artifacts/x/manifest.json",
        error={"code": "partial", "type": "Warning", "message": "token sk-secret", "cause": 3},
        cleanup="confirmed",
    )
    assert build_output(snapshot)["metadata"]["nemo_gym"] == {
        "request_id": RID,
        "status": "completed",
        "metrics": {},
        "artifact_ref": "/var/relax-gym/artifacts/x/manifest.json",
        "error": {"code": "partial", "type": "Warning"},
        "cleanup": "confirmed",
    }


def test_write_is_compact_utf8_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "session_output.json"
    target.write_text("old")
    assert write_output(target, {"reward": 1.0, "metadata": {"note": "é"}}) is True
    assert target.read_bytes() == '{"reward":1.0,"metadata":{"note":"é"}}'.encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session_output.json"]


def test_unencodable_payload_keeps_old_file(tmp_path: Path) -> None:
    target = tmp_path / "session_output.json"
    target.write_text("old")
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_output(target, {"reward": float("nan")})
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session_output.json"]


def test_failed_replace_keeps_old_file_and_removes_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "session_output.json"
    target.write_text("old")

    def broken_replace(src: str, dst: Any) -> None:
        assert Path(src).exists()  # the temp file was written next to the target
        assert Path(src).parent == tmp_path
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(output_module.os, "replace", broken_replace)
    with pytest.raises(PermissionError):
        write_output(target, {"reward": 1.0})
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session_output.json"]


def test_removed_session_dir_is_skipped(tmp_path: Path) -> None:
    gone = tmp_path / "relax-agentic-command-x"
    assert write_output(gone / "session_output.json", {"reward": 1.0}) is False
    assert not gone.exists()


def test_output_round_trips_through_json(snap: Any, tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    write_output(target, build_output(snap(reward={"scalar": 0.5, "components": {"a": 1}})))
    data = json.loads(target.read_text())
    assert data["reward"] == 0.5
    assert data["metadata"]["nemo_gym"]["reward_components"] == {"a": 1}
