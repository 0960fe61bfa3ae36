"""CallbackScope: a trial's abort ends its model calls in flight, and no other cancellation is swallowed."""

from __future__ import annotations

import asyncio

import pytest

from relax_gym_core.trials import CallbackScope

pytestmark = pytest.mark.anyio


async def _call_in(scope: CallbackScope, started: asyncio.Event) -> str:
    with scope:
        started.set()
        await asyncio.sleep(3600)
        return "answered"
    return "cancelled"  # the scope ended its own cancellation: the call goes on past it


async def _running(scope: CallbackScope) -> asyncio.Task[str]:
    """A call inside `scope`, once it is waiting for its answer."""
    started = asyncio.Event()
    task = asyncio.create_task(_call_in(scope, started))
    await started.wait()
    return task


async def test_cancel_ends_the_call_at_the_scope_and_unregisters_it() -> None:
    calls: dict[str, set[CallbackScope]] = {}
    scope = CallbackScope(calls, "r1")
    task = await _running(scope)
    assert calls == {"r1": {scope}}
    scope.cancel()
    assert await task == "cancelled"
    assert scope.cancelled
    assert calls == {}
    assert task.cancelling() == 0  # nothing of the cancellation is left on the task


async def test_a_cancellation_from_elsewhere_is_not_swallowed() -> None:
    scope = CallbackScope({}, "r1")
    task = await _running(scope)
    scope.cancel()
    task.cancel()  # the agent went away at the same time
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_only_a_cancellation_from_elsewhere_passes_through() -> None:
    scope = CallbackScope({}, "r1")
    task = await _running(scope)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not scope.cancelled


async def test_the_call_goes_on_after_a_scope_that_ended() -> None:
    calls: dict[str, set[CallbackScope]] = {}
    scope = CallbackScope(calls, "r1")
    with scope:
        await asyncio.sleep(0)
    scope.cancel()  # the trial ended after its call did: nothing to cancel
    await asyncio.sleep(0)  # and this task is not cancelled
    assert not scope.cancelled
    assert calls == {}


async def test_scopes_of_one_trial_are_kept_until_the_last_leaves() -> None:
    calls: dict[str, set[CallbackScope]] = {}
    first, second = CallbackScope(calls, "r1"), CallbackScope(calls, "r1")
    with first:
        with second:
            assert calls == {"r1": {first, second}}
        assert calls == {"r1": {first}}
    assert calls == {}
