"""For servers a plugin runs INSIDE the NeMo Gym environment (its resources servers and agents): the wire
names and the cleanup protocol, in the standard library only (that environment has NeMo Gym's
dependencies, not the core's; relax_gym_core.protocol re-uses these names, so they are spelled once).

A trial's rollout id comes in the /run body as _ng_rollout_id (NeMo Gym main's explicit id), as
_ng_task_index/_ng_rollout_index (older NeMo Gyms join them as ``f"{task}-{rollout}"``), and also as the tag
in ``responses_create_params.metadata``. A stateful server
keys what a trial holds by it and proves its release at CLEANUP_PATH: ``POST`` releases everything the
rollout holds (and refuses to start it afterwards: CleanedRollouts remembers it), ``GET`` answers
``{"rollout_id": ..., "clean": true|false}``, checked now. A server that releases a rollout as its run ends
(in /verify) can say so in that answer instead (mark_released): the agent passes it on in the /run answer,
and the gateway takes it as the probe's answer without asking (released_in).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

BRIDGE_PREFIX: Final = "/ng-rollout/"  # the per-trial model-call prefix (NeMo Gym's), then the rollout id
ROLLOUT_TAG: Final = "relax_gym_rollout"  # the metadata key holding a trial's rollout id
TASK_INDEX: Final = "_ng_task_index"  # NeMo Gym's /run body keys; the rollout id is "<task>-<rollout>"
ROLLOUT_INDEX: Final = "_ng_rollout_index"
ROLLOUT_ID: Final = "_ng_rollout_id"  # NeMo Gym main (#2124): the explicit id, which wins over the pair
# NeMo Gym >= 0.5 appends "-a<n>" to the id of a re-dispatched attempt (_ng_attempt_index > 0), and agents
# with training token capture call models under "/ng-rollout/<id>/training-token-capture/v1/...".
ATTEMPT_INDEX: Final = "_ng_attempt_index"
TOKEN_CAPTURE_SEGMENT: Final = "training-token-capture"  # noqa: S105 - a path segment, not a secret
CLEANUP_PATH: Final = "/cleanup/{rollout_id}"  # POST: release; GET: {"rollout_id", "clean"}
RELEASED_KEY: Final = "relax_gym_released"  # in a verify answer's params metadata: the rollout id left clean


def _index(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return str(value) if str(value) else None


def tag_of(params: Any) -> str | None:
    """The rollout id tagged in a request's params (``metadata.relax_gym_rollout``), else None. `params`
    is a dict or a NeMo Gym params model (anything with a ``metadata`` attribute)."""
    metadata = params.get("metadata") if isinstance(params, Mapping) else getattr(params, "metadata", None)
    tag = metadata.get(ROLLOUT_TAG) if isinstance(metadata, Mapping) else None
    return tag if isinstance(tag, str) and tag else None


def rollout_id_of(fields: Mapping[str, Any] | None, params: Any = None) -> str | None:
    """The rollout id a /run body (or what an agent forwards of it) carries, or None (e.g. a plain NeMo
    Gym rollout collection): its explicit _ng_rollout_id, else its indices joined as NeMo Gym joins them,
    else the tag in `params` (default: the body's own ``responses_create_params``)."""
    fields = fields or {}
    explicit = fields.get(ROLLOUT_ID)
    if isinstance(explicit, str) and explicit:
        return explicit
    task, rollout = _index(fields.get(TASK_INDEX)), _index(fields.get(ROLLOUT_INDEX))
    if task is not None and rollout is not None:
        return f"{task}-{rollout}"
    return tag_of(fields.get("responses_create_params") if params is None else params)


def attempt_of(rollout_id: str) -> str | None:
    """The rollout id an attempt's id names (``<id>-a<n>``, n >= 1, as NeMo Gym >= 0.5 suffixes a
    re-dispatched attempt), else None."""
    base, dash, attempt = rollout_id.rpartition("-a")
    return base if dash and base and attempt.isdigit() and attempt.isascii() and int(attempt) > 0 else None


def mark_released(params: Any, rollout_id: str) -> None:
    """State in a verify answer's ``responses_create_params`` (a NeMo Gym params model) that the server holds
    nothing of `rollout_id` any more: checked by the caller just before, as a GET at CLEANUP_PATH would."""
    metadata = getattr(params, "metadata", None)
    params.metadata = {**(metadata if isinstance(metadata, Mapping) else {}), RELEASED_KEY: rollout_id}


def released_in(answer: Any) -> str | None:
    """The rollout id a /run answer states released (mark_released, passed on by the agent), else None."""
    params = answer.get("responses_create_params") if isinstance(answer, Mapping) else None
    metadata = params.get("metadata") if isinstance(params, Mapping) else None
    released = metadata.get(RELEASED_KEY) if isinstance(metadata, Mapping) else None
    return released if isinstance(released, str) and released else None


class CleanedRollouts:
    """The rollout ids cleaned up lately (the oldest forgotten past `capacity`): a late start of one, an
    abort that overtook its seed, is refused instead of leaking what it would hold."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = max(capacity, 1)
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, rollout_id: str) -> None:
        self._ids[rollout_id] = None
        self._ids.move_to_end(rollout_id)
        while len(self._ids) > self._capacity:
            self._ids.popitem(last=False)

    def __contains__(self, rollout_id: object) -> bool:
        return rollout_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)
