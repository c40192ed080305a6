"""Unit tests of :mod:`aiolock._kinds.semaphore.handle`: a permit's
``extend(additional=...)`` adds to its own lease left, as a lock's does."""

from __future__ import annotations

import asyncio
import math

import pytest
from redis.asyncio import Redis

import aiolock


async def test_a_permit_adds_to_its_own_lease_left(
    locks: aiolock.LockManager, redis: Redis
) -> None:
    sem = locks.semaphore("add-sem", 3, lease=30)
    short = await sem.acquire(1)
    longer = await sem.acquire(1, lease=60)  # the holders' hash lives as long as this one
    expiry = sem.key + ":expiry"
    before = await redis.zscore(expiry, short._hold.field)
    await short.extend(additional=20)
    after = await redis.zscore(expiry, short._hold.field)
    assert before is not None and after is not None
    # Added to this permit's own lease end (not set from the hash's longer TTL, 60 s).
    assert before + 20_000 - 5_000 < after <= before + 20_000 + 50
    assert short.held and longer.held
    await short.extend(additional=40)  # now the longest: the keys must live as long
    assert await redis.pttl(sem.key) > 80_000
    assert await redis.pttl(expiry) > 80_000
    await short.release()
    await longer.release()


async def test_a_permit_local_deadline_follows_the_addition(locks: aiolock.LockManager) -> None:
    sem = locks.semaphore("add-sem-deadline", 2, lease=1.0)
    permit = await sem.acquire()
    await permit.extend(additional=10)
    await asyncio.sleep(1.5)  # past the first lease: lost, had the deadline not moved
    assert permit.held
    assert await sem.holders() == 1
    await permit.release()


async def test_a_permit_refuses_like_a_lock(locks: aiolock.LockManager, admin: Redis) -> None:
    sem = locks.semaphore("add-sem-errors", 2, lease=30)
    permit = await sem.acquire()
    with pytest.raises(TypeError, match="exactly one"):
        await permit.extend(5, additional=5)
    with pytest.raises(TypeError, match="exactly one"):
        await permit.extend()
    for value, error in ((0, ValueError), (math.nan, ValueError), (True, TypeError)):
        with pytest.raises(error, match="additional"):
            await permit.extend(additional=value)
    auto = await sem.acquire(lease=None)
    with pytest.raises(aiolock.LockError, match="renewed automatically"):
        await auto.extend(additional=5)
    await auto.release()
    await admin.delete(sem.key, sem.key + ":expiry")  # deleted behind our back
    with pytest.raises(aiolock.LockLostError, match="could not be extended"):
        await permit.extend(additional=5)
    assert not await admin.exists(sem.key)  # not brought back
    with pytest.raises(aiolock.LockLostError):
        await permit.release()
