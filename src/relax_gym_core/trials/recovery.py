"""Restart recovery: prove the environment released the runs of trials a previous process left behind.

The book ends those trials at start (cause service_restart, trials/book.py recover()); what is left is
their cleanup, run by rollout id (Runtime.handle_for) through the usual ladder, abort -> force -> probe.
An environment that cannot be reached at start (or cannot prove it yet) is tried again with back-off:
the trial reads `cleanup: pending` meanwhile, and `unverified` once the service gives up. Never dropped.
A handle that says it is `unreachable` (the replica that ran the run is gone with its process) is
`unverified` at once: waiting cannot bring it back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from attrs import frozen

from relax_gym_core.plugin.runs import CLEANUP_UNVERIFIED, CleanupResult, RunHandle

logger = logging.getLogger("relax_gym.trials")


@frozen(kw_only=True)
class RecoveryPolicy:
    first_retry_s: float = 1.0
    max_retry_s: float = 30.0
    give_up_s: float = 600.0  # RELAX_GYM_RECOVERY_GIVE_UP_S


async def prove_released(
    handle: RunHandle | None,
    ladder: Callable[[RunHandle], Awaitable[CleanupResult]],
    policy: RecoveryPolicy,
    *,
    clock: Callable[[], float],
    label: str,
) -> CleanupResult:
    """Run `ladder` on `handle` until it confirms, with back-off; unverified when `policy` gives up (or
    when no runtime could address the run at all: handle None)."""
    if handle is None:
        return CLEANUP_UNVERIFIED
    if getattr(handle, "unreachable", False):
        # What ran it is gone for good (a replica of an earlier process): no retry can prove anything.
        logger.warning("recovery: cleanup of %s unverifiable (the replica that ran it is gone)", label)
        return CLEANUP_UNVERIFIED
    give_up_at = clock() + policy.give_up_s
    delay = policy.first_retry_s
    attempts = 0
    while True:
        outcome = await ladder(handle)
        attempts += 1
        if outcome.confirmed:
            return outcome
        if clock() + delay > give_up_at:
            logger.warning(
                "recovery: cleanup of %s not proven after %d attempt(s); recorded unverified", label, attempts
            )
            return CLEANUP_UNVERIFIED
        logger.info(
            "recovery: cleanup of %s not proven (%s); retry in %.1f s", label, outcome.error_code, delay
        )
        await asyncio.sleep(delay)
        delay = min(2 * delay, policy.max_retry_s)
