"""The trajectory API: one ended trial's trajectory (GET /v1/trials/{request_id}/trajectory), or several in
one answer (GET /v1/trajectories?request_id=...&request_id=...).

`relax-gym rollout` reads every trial's trajectory as the trial ends; one request per trial cost both sides
more than the trajectories themselves (bench/rollout.py), so it asks for the trials that ended together at
once. An answer holds documents up to ANSWER_BUDGET bytes (the first always): the ids left out are named
under `deferred`, to be asked again.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from relax_gym_core.errors import FieldError, TrialExpiredError, TrialNotFoundError
from relax_gym_core.protocol import MAX_TRAJECTORY_IDS, jsonutil, unstructure
from relax_gym_core.trajectories import counts
from relax_gym_core.trials import TrialService
from relax_gym_core.web import json_response

ANSWER_BUDGET = 8 << 20  # bytes of documents in one answer (a client reads up to 16 MiB)
RESULT_FIELDS = ("status", "reward", "metrics", "error", "cleanup")


async def _document(service: TrialService, request_id: str) -> dict[str, Any]:
    """The trial's trajectory with its result and counts, or TrialNotFoundError saying why there is none."""
    try:
        snapshot = service.get(request_id)
    except TrialExpiredError:
        raise TrialNotFoundError(f"trial {request_id!r}: its trajectory expired with its record") from None
    if service.trajectories is None:
        raise TrialNotFoundError("this gateway keeps no trajectories (RELAX_GYM_TRAJECTORIES=off)")
    if not snapshot.status.is_terminal:
        raise TrialNotFoundError(
            f"trial {request_id!r} is {snapshot.status.value}: its trajectory comes when it ends"
        )
    document = await service.trajectories.read(request_id)
    if document is None:
        raise TrialNotFoundError(
            f"trial {request_id!r} kept no trajectory (it never ran, or ran when the gateway stopped)"
        )
    result = unstructure(snapshot)
    document["result"] = {key: result.get(key) for key in RESULT_FIELDS}
    document["counts"] = counts(document)
    return document


def _service(request: Request) -> TrialService:
    service: TrialService = request.app.state.gateway.service
    return service


async def get_trajectory(request: Request) -> Response:
    """What the trial's run was asked and answered and every model call it made (trajectories/), once it
    has ended; 404 before, after its record expired, or when none was kept."""
    return json_response(await _document(_service(request), request.path_params["request_id"]))


async def get_trajectories(request: Request) -> Response:
    """`{"trajectories": {id: document}, "missing": {id: why}, "deferred": [id, ...]}` for the ids asked."""
    asked = list(dict.fromkeys(request.query_params.getlist("request_id")))
    if not 1 <= len(asked) <= MAX_TRAJECTORY_IDS:
        raise FieldError(f"request_id: ask for 1 to {MAX_TRAJECTORY_IDS} trials at once, got {len(asked)}")
    service = _service(request)
    documents: list[bytes] = []
    missing: dict[str, str] = {}
    deferred: list[str] = []
    size = 0
    for request_id in asked:
        if documents and size >= ANSWER_BUDGET:
            deferred.append(request_id)
            continue
        try:
            encoded = jsonutil.dumps(await _document(service, request_id))
        except TrialNotFoundError as exc:
            missing[request_id] = str(exc)
            continue
        if documents and size + len(encoded) > ANSWER_BUDGET:
            deferred.append(request_id)
            continue
        documents.append(jsonutil.dumps(request_id) + b":" + encoded)
        size += len(encoded)
    # Each document is encoded once, as it is read: the answer is put together around them.
    body = b"".join((
        b'{"trajectories":{', b",".join(documents), b'},"missing":', jsonutil.dumps(missing),
        b',"deferred":', jsonutil.dumps(deferred), b"}",
    ))  # fmt: skip
    return Response(body, media_type="application/json")
