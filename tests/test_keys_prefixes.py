"""Prefixes, kinds and names never share a key (issue 18, item 2).

A prefix may contain ``:`` and the kinds' tags, so before issue 18 prefix ``app:sem`` with
lock ``x`` and prefix ``app`` with semaphore ``x`` both used ``app:sem:{x}``.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

import aiolock


async def test_a_lock_under_prefix_app_sem_and_a_semaphore_under_app_are_independent(
    redis: Redis, prefix: str
) -> None:
    # Regression: releasing the lock deleted the semaphore's holders (one hash for both),
    # and the semaphore then granted 4 permits with a limit of 2.
    async with (
        aiolock.LockManager(redis, prefix=f"{prefix}:sem") as lock_side,
        aiolock.LockManager(redis, prefix=prefix) as sem_side,
    ):
        lock = lock_side.lock("x", timeout=0)
        semaphore = sem_side.semaphore("x", 2, timeout=0)
        await lock.acquire()
        first = await semaphore.acquire()
        second = await semaphore.acquire()
        await lock.release()
        # Both permits are still held: a third request must not be granted.
        with pytest.raises(aiolock.LockTimeoutError):
            await semaphore.acquire()
        assert await semaphore.holders() == 2
        await first.release()
        await second.release()
        # And the lock is free and works on its own.
        async with lock_side.lock("x", timeout=0):
            pass
