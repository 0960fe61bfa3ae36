"""A trial as one ledger row, and back: what is recorded, and what never is.

Recorded: identity (request id, environment, config, rollout id), the state (phase, status, cleanup,
cause), the result (reward, metrics, artifact_ref, error: one JSON column, NULL until there is one), the
replay fingerprint (a keyed HMAC digest, see idempotency.py), the times, and the run's placement (which
replica ran it, so a restarted gateway addresses its cleanup there; NULL when the runtime has no
replicas). Never recorded: the request (the session's api key and token go with it, and the task).
The rollout id is a live bridge key only in the memory of the process that issued it. Times are the
book's monotonic clock in memory and wall-clock seconds on disk (a monotonic clock restarts with the machine);
`offset` converts between the two. Plain columns keep a row cheap to write: most writes carry no result.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from relax_gym_core.errors import ProtocolError
from relax_gym_core.protocol import CleanupState, TrialStatus, jsonutil
from relax_gym_core.trials.records import Cause, Phase, Trial

logger = logging.getLogger("relax_gym.ledger")

SCHEMA_VERSION: Final = 2
# Ledgers of an older schema are brought up to date in place (each step one statement, in order).
MIGRATIONS: Final = {
    "1": "ALTER TABLE trials ADD COLUMN placement TEXT",  # 1 -> 2: the replica a run was placed on
}
SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS trials (
        request_id TEXT PRIMARY KEY,
        environment TEXT NOT NULL,
        config TEXT NOT NULL,
        rollout_id TEXT NOT NULL,
        fingerprint BLOB NOT NULL,
        phase TEXT NOT NULL,
        status TEXT NOT NULL,
        cleanup TEXT NOT NULL,
        cause TEXT,
        detail TEXT,
        holds_slot INTEGER NOT NULL,
        created_at REAL NOT NULL,
        deadline_at REAL NOT NULL,
        lease_expires_at REAL NOT NULL,
        finished_at REAL,
        settled_at REAL,
        result TEXT,
        placement TEXT
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS trials_settled ON trials (settled_at) WHERE settled_at IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS tombstones (request_id TEXT PRIMARY KEY, at REAL NOT NULL)",
)
# Spelled out, not assembled: no SQL here is ever built from values.
UPSERT: Final = (  # an update in place when the row exists (cheaper than REPLACE's delete + insert)
    "INSERT INTO trials (request_id, environment, config, rollout_id, fingerprint, phase, status, "
    "cleanup, cause, detail, holds_slot, created_at, deadline_at, lease_expires_at, finished_at, settled_at, "
    "result, placement) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (request_id) DO UPDATE SET phase = excluded.phase, status = excluded.status, "
    "cleanup = excluded.cleanup, cause = excluded.cause, detail = excluded.detail, "
    "holds_slot = excluded.holds_slot, lease_expires_at = excluded.lease_expires_at, "
    "finished_at = excluded.finished_at, settled_at = excluded.settled_at, result = excluded.result, "
    "placement = excluded.placement"
)
SELECT_ONE: Final = (
    "SELECT request_id, environment, config, rollout_id, fingerprint, phase, status, cleanup, cause, detail, "
    "holds_slot, created_at, deadline_at, lease_expires_at, finished_at, settled_at, result, placement "
    "FROM trials WHERE request_id = ?"
)
SELECT_UNSETTLED: Final = (
    "SELECT request_id, environment, config, rollout_id, fingerprint, phase, status, cleanup, cause, detail, "
    "holds_slot, created_at, deadline_at, lease_expires_at, finished_at, settled_at, result, placement "
    "FROM trials WHERE settled_at IS NULL"
)
SETTLED_AT: Final = 15  # index of settled_at in a row

type Row = tuple[Any, ...]


def _shift(value: float | None, offset: float) -> float | None:
    return None if value is None else value + offset


def _result(trial: Trial) -> str | None:
    if trial.reward is None and not trial.metrics and trial.artifact_ref is None and trial.error is None:
        return None
    result = {"reward": trial.reward, "metrics": trial.metrics, "artifact_ref": trial.artifact_ref}
    result["error"] = trial.error
    try:
        return jsonutil.dumps(result).decode()
    except (ProtocolError, TypeError, ValueError):
        # Results are validated JSON when a run reports them; should one still not encode, the record
        # keeps its state and loses the result, rather than wedging every later write. Not
        # logger.exception: the error may quote the value, and results are the environment's data.
        logger.error(  # noqa: TRY400
            "trial request_id=%s: result not encodable; recorded without it", trial.request_id
        )
        return jsonutil.dumps({"error": {"code": "unrecordable_result"}}).decode()


def encode(trial: Trial, offset: float) -> Row:
    """The row of a trial as it is now (wall-clock times: monotonic + offset)."""
    return (
        trial.request_id,
        trial.env[0],
        trial.env[1],
        trial.rollout_id,
        trial.fingerprint,
        trial.phase.value,
        trial.status.value,
        trial.cleanup.value,
        None if trial.cause is None else trial.cause.value,
        trial.detail,
        int(trial.holds_slot),
        trial.created_at + offset,
        trial.deadline_at + offset,
        trial.lease_expires_at + offset,
        _shift(trial.finished_at, offset),
        _shift(trial.settled_at, offset),
        _result(trial),
        trial.placement,
    )


def decode(row: Row, offset: float) -> Trial:
    """A trial read back (monotonic times: wall - offset). It has no request (its rollout id is not live)."""
    (
        request_id,
        environment,
        config,
        rollout_id,
        fingerprint,
        phase,
        status,
        cleanup,
        cause,
        detail,
        holds_slot,
        created_at,
        deadline_at,
        lease_expires_at,
        finished_at,
        settled_at,
        result_json,
        placement,
    ) = row
    result: dict[str, Any] = jsonutil.loads(result_json) if result_json is not None else {}
    return Trial(
        request_id=request_id,
        env=(environment, config),
        rollout_id=rollout_id,
        fingerprint=bytes(fingerprint),
        request=None,
        created_at=created_at - offset,
        deadline_at=deadline_at - offset,
        lease_expires_at=lease_expires_at - offset,
        status=TrialStatus(status),
        phase=Phase(phase),
        cause=None if cause is None else Cause(cause),
        detail=detail,
        holds_slot=bool(holds_slot),
        reward=result.get("reward"),
        metrics=result.get("metrics"),
        artifact_ref=result.get("artifact_ref"),
        error=result.get("error"),
        cleanup=CleanupState(cleanup),
        finished_at=_shift(finished_at, -offset),
        settled_at=_shift(settled_at, -offset),
        placement=placement,
    )
