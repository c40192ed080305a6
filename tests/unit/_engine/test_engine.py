"""Unit tests of :mod:`aiolock._engine.engine`: the operations the engine runs for a handle
outside acquiring and waiting (force release here)."""

from __future__ import annotations

import asyncio

import pytest

import aiolock
from aiolock._keys import LockKeys
from aiolock._kinds.fair.kind import FairLockKind
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
