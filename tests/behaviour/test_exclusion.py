"""Mutual exclusion, reentrancy per task, and fencing tokens."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from redis.asyncio import Redis

import aiolock


async def test_reentrant_within_one_task(locks: aiolock.LockManager) -> None:
    lock = locks.lock("re")
    async with lock:
        token = lock.fencing_token
        assert await lock.hold_count() == 1
        async with locks.lock("re") as again:  # another handle, same task: same owner
            assert await again.hold_count() == 2
            assert again.fencing_token == token  # re-entry is not a new acquisition
            await lock.acquire()
            assert await lock.hold_count() == 3
            await lock.release()
        assert await lock.hold_count() == 1
        assert await lock.locked()
    assert not await lock.locked()
    assert lock.fencing_token is None


async def test_other_tasks_are_excluded_and_child_tasks_are_other_owners(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("ex")
    async with lock:
        assert await lock.owned()

        async def child() -> tuple[bool, bool]:
            return await lock.owned(), await lock.try_acquire(timeout=0.05)

        owned_by_child, child_got_it = await asyncio.create_task(child())
        assert not owned_by_child
        assert not child_got_it
    assert await asyncio.create_task(lock.try_acquire())  # free again, child task takes it


async def test_release_by_a_non_owner_fails_clearly(locks: aiolock.LockManager) -> None:
    lock = locks.lock("no")
    with pytest.raises(aiolock.LockNotOwnedError, match="not held by the current task"):
        await lock.release()
    await lock.acquire()

    async def other() -> None:
        await lock.release()

    with pytest.raises(aiolock.LockNotOwnedError):
        await asyncio.create_task(other())
    await lock.release()
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.release()  # double release
    assert not await lock.locked()


async def _max_concurrency(managers: list[aiolock.LockManager], tasks_each: int) -> int:
    inside = 0
    peak = 0

    async def worker(manager: aiolock.LockManager) -> None:
        nonlocal inside, peak
        for _ in range(10):
            async with manager.lock("shared"):
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.001)
                inside -= 1

    await asyncio.gather(*(worker(m) for m in managers for _ in range(tasks_each)))
    return peak


async def test_exclusion_across_tasks_and_managers(redis_url: str, prefix: str) -> None:
    async with (
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix) as one,
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix) as two,
    ):
        assert await _max_concurrency([one, two], tasks_each=4) == 1
        assert one.statistics().held == 0
        assert two.statistics().hub.waiters == 0
        await one.redis.aclose()
        await two.redis.aclose()


async def test_fencing_tokens_increase_strictly_across_holders(redis_url: str, prefix: str) -> None:
    tokens: list[int] = []
    async with (
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix) as one,
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix) as two,
    ):

        async def worker(manager: aiolock.LockManager) -> None:
            for _ in range(15):
                async with manager.lock("fenced") as lock:
                    assert lock.fencing_token is not None
                    tokens.append(lock.fencing_token)
                    await asyncio.sleep(0)

        await asyncio.gather(*(worker(m) for m in (one, two, one, two)))
        await one.redis.aclose()
        await two.redis.aclose()
    assert len(tokens) == 60
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens


async def test_fencing_tokens_keep_increasing_when_the_server_clock_lags(
    locks: aiolock.LockManager, redis: Redis
) -> None:
    lock = locks.lock("clock")
    async with lock:
        first = lock.fencing_token
    assert first is not None
    # Pretend an earlier holder got a token from the future (a clock set back since): the
    # lock's free state keeps the epoch and the last token (issue 21)
    await redis.set(f"{locks.prefix}:lock:{{clock}}", f"|{first}|{first + 10**12}", px=60000)
    async with lock:
        assert lock.fencing_token == first + 10**12 + 1


async def test_try_acquire_makes_one_attempt_by_default(locks: aiolock.LockManager) -> None:
    lock = locks.lock("try")
    assert await lock.try_acquire()

    async def contender() -> bool:
        return await lock.try_acquire()

    assert not await asyncio.create_task(contender())
    await lock.release()
