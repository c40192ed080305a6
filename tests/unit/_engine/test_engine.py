"""Unit tests of :mod:`aiolock._engine.engine`: the operations the engine runs for a handle
outside acquiring and waiting (force release here)."""

from __future__ import annotations

import asyncio

import pytest

import aiolock
from aiolock._engine.kind import Attempt, Busy, Granted
from aiolock._keys import LockKeys
from aiolock._kinds.fair.kind import FairLockKind
from aiolock._kinds.lock.kind import ReentrantLockKind
from tests._support.helpers import eventually


async def test_a_force_release_leaves_the_grant_it_made_to_our_own_waiter(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fair lock's force release grants the lock to the next waiter in the same script.

    When that waiter is a task of the manager that sent the force release, it may hold the
    lock before the script's reply is read; the force release used to take every local
    hold of the name for one it had deleted, so the new holder was told it lost a lock it
    had just been given (seen as a flake of the fair lock's force-release test under
    CI's load). Here the reply is held back until the waiter holds, every time.
    """
    took = asyncio.Event()
    original = FairLockKind.force_release

    async def reply_after_the_grant(self: FairLockKind, keys: LockKeys) -> bool:
        held = await original(self, keys)
        await asyncio.wait_for(took.wait(), 10)
        return held

    async with (
        aiolock.LockManager.from_url(redis_url, prefix=prefix) as locks,
        aiolock.LockManager.from_url(redis_url, prefix=prefix) as other,
    ):
        holder = other.fair_lock("forced")
        await holder.acquire()
        gate = asyncio.Event()

        async def waiter() -> int | None:
            lock = locks.fair_lock("forced")
            async with lock:
                took.set()
                await gate.wait()
                return lock.fencing_token

        task = asyncio.create_task(waiter())
        await eventually(lambda: locks.statistics().claims == 1, what="the waiter queued")
        monkeypatch.setattr(FairLockKind, "force_release", reply_after_the_grant)
        assert await locks.fair_lock("forced").force_release()
        assert locks.statistics().lost.get("fair lock", 0) == 0
        assert locks.statistics().held == 1
        gate.set()
        token = await asyncio.wait_for(task, 10)  # no LockLostError from the body
        assert token is not None and token > (holder.fencing_token or 0)
        with pytest.raises(aiolock.LockLostError):
            await holder.release()


async def test_a_hold_registered_while_the_force_release_runs_is_checked_with_redis(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order: the acquire ran on the server before the force release, but its
    reply was read (and the hold registered) only while the force release's reply was
    on its way. The force release deleted it: the holder must be told at once, not at
    the next renewal, 10 s on (seen as a flake under two CI runs at once)."""
    granted, registered = asyncio.Event(), asyncio.Event()
    let_it_finish = asyncio.Event()
    attempt, force_release = ReentrantLockKind.attempt, ReentrantLockKind.force_release

    async def slow_attempt(self: ReentrantLockKind, request: Attempt) -> Granted | Busy:
        outcome = await attempt(self, request)  # run on the server
        granted.set()
        await let_it_finish.wait()  # ... and read late
        return outcome

    async def reply_after_the_registration(self: ReentrantLockKind, keys: LockKeys) -> bool:
        held = await force_release(self, keys)
        let_it_finish.set()
        await asyncio.wait_for(registered.wait(), 10)
        return held

    monkeypatch.setattr(ReentrantLockKind, "attempt", slow_attempt)
    monkeypatch.setattr(ReentrantLockKind, "force_release", reply_after_the_registration)
    lock = locks.lock("late")
    stop = asyncio.Event()

    async def holder() -> None:
        async with lock:
            registered.set()
            await stop.wait()

    task = asyncio.create_task(holder())
    await asyncio.wait_for(granted.wait(), 10)
    assert await locks.lock("late").force_release()
    assert locks.statistics().lost.get("lock", 0) == 1
    with pytest.raises(aiolock.LockLostError):
        await asyncio.wait_for(task, 10)  # its body was cancelled by the loss
