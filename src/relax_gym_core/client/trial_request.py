"""Build the create request of one Relax session (reference §5.3)."""

from __future__ import annotations

import copy
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from relax_gym_core.client.exceptions import ClientConfigError
from relax_gym_core.client.settings import ClientSettings
from relax_gym_core.errors import ProtocolError
from relax_gym_core.protocol import (
    PROTOCOL_VERSION,
    CreateTrialRequest,
    EnvironmentRef,
    Generation,
    ModelEndpoint,
    SessionInfo,
    jsonutil,
)

INTEGRATION_METADATA = {"integration": "relax"}


def stable_request_id(session_id: str, attempt: int = 1, *, invocation_id: str | None = None) -> str:
    """`relax-<sha256 hex>`: stable across retries of one launch, new for a relaunch (new IO dir).

    The session id is a credential, so it only enters through the hash.
    """
    key = f"{session_id}\0{attempt}" if not invocation_id else f"{invocation_id}\0{session_id}\0{attempt}"
    return "relax-" + hashlib.sha256(key.encode()).hexdigest()


MAX_INPUT_BYTES = 64 << 20  # far beyond any task a gateway accepts (its create cap is 4 MiB by default)


def read_session_input(path: str | Path) -> dict[str, Any]:
    """Read and check RELAX_INPUT_JSON: an object with a messages array and an optional metadata object.

    Only a regular file is read: a FIFO or a device would block the session, or never end.
    """
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever, before any check.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ClientConfigError(f"RELAX_INPUT_JSON cannot be read: {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ClientConfigError(f"RELAX_INPUT_JSON must be a regular file: {path}")
        try:
            raw = handle.read(MAX_INPUT_BYTES + 1)
        except OSError as exc:
            raise ClientConfigError(f"RELAX_INPUT_JSON cannot be read: {path}: {exc.strerror}") from None
    if len(raw) > MAX_INPUT_BYTES:
        raise ClientConfigError(f"RELAX_INPUT_JSON is larger than {MAX_INPUT_BYTES} bytes: {path}")
    try:
        data = jsonutil.loads(raw)
    except ProtocolError:
        raise ClientConfigError("RELAX_INPUT_JSON must contain valid JSON with finite numbers") from None
    return check_session_input(data)


def check_session_input(data: object) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ClientConfigError("RELAX_INPUT_JSON must contain a JSON object")
    if not isinstance(data.get("messages"), list):
        raise ClientConfigError("RELAX_INPUT_JSON must contain a messages array")
    metadata = data.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise ClientConfigError("RELAX_INPUT_JSON metadata must be a JSON object")
    return data


def _routing_value(metadata: dict[str, Any], key: str) -> str | None:
    value = metadata.get(key)
    if value is None or value == "":
        return None
    # A non-string route cannot name a registered environment; refusing beats silently falling back.
    if not isinstance(value, str) or not value.strip():
        raise ClientConfigError(f"RELAX_INPUT_JSON metadata.{key} must be a non-empty string")
    return value


def resolve_route(session_input: dict[str, Any], settings: ClientSettings) -> tuple[str, str]:
    """(environment, config): per-row metadata wins over NEMO_GYM_ENVIRONMENT / NEMO_GYM_CONFIG."""
    metadata = session_input.get("metadata") or {}
    environment = _routing_value(metadata, "environment") or settings.environment
    if environment is None:
        raise ClientConfigError(
            "NEMO_GYM_ENVIRONMENT must be set (or the session input must carry metadata.environment)"
        )
    config = _routing_value(metadata, "config") or settings.config or environment
    return environment, config


def build_create_request(session_input: dict[str, Any], settings: ClientSettings) -> CreateTrialRequest:
    """The create body for this session: the whole input is the task; the session id is the callback key."""
    session_input = check_session_input(session_input)
    environment, config = resolve_route(session_input, settings)
    try:
        return CreateTrialRequest(
            protocol_version=PROTOCOL_VERSION,
            request_id=stable_request_id(
                settings.session_id, settings.attempt, invocation_id=settings.session_io_dir
            ),
            session=SessionInfo(
                session_id=settings.session_id,
                group_id=settings.group_id,
                rollout_mode=settings.rollout_mode,
                attempt=settings.attempt,
            ),
            environment=EnvironmentRef(name=environment, config=config, task=copy.deepcopy(session_input)),
            model_endpoint=ModelEndpoint(
                base_url=settings.base_url.rstrip("/"), api_key=settings.session_id, model=settings.model
            ),
            interrupt_policy=settings.interrupt_policy,
            generation=Generation(
                responses_create_params=copy.deepcopy(settings.responses_create_params),
                sampling_params=copy.deepcopy(settings.sampling_params),
            ),
            deadline_s=settings.deadline_s,
            lease_s=settings.lease_s,
            metadata=dict(INTEGRATION_METADATA),
        )
    except ValueError as exc:  # field validators name the wire field, never its value
        raise ClientConfigError(f"cannot build the trial request: {exc}") from None
