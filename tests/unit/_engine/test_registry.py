"""Lost holds are remembered only until their owner is told or can no longer ask
(issue 24, item 5): the registry of lost holds must not grow over a long run."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.engine import Engine


def _engine(locks: aiolock.LockManager) -> Engine:
    engine = locks._engine
    assert engine is not None
    return engine


def _remembered(locks: aiolock.LockManager) -> int:
    return len(_engine(locks).registry._lost)


async def _held(redis: Redis, key: str) -> bool:
    """Whether *key* holds something: a lock's state (a string since issue 21) is free
    when it reads ``|<epoch>|<last token>``; any other key while it exists."""
    value: Any = await redis.get(key) if await redis.type(key) in (b"string", "string") else None
    if value is not None:
        return not value.startswith(b"|")
    return bool(await redis.exists(key))


async def _gone(redis: Redis, key: str, limit: float = 10.0) -> bool:
    """Whether *key* is freed in Redis within *limit* seconds (polled, bounded)."""
    deadline = time.monotonic() + limit
    while await _held(redis, key):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_releasing_a_lost_permit_forgets_it(locks: aiolock.LockManager) -> None:
    sem = locks.semaphore("lost-permit", 2)
    permit = await sem.acquire()
    assert await sem.force_release()  # the permit is lost, and this client knows it at once
    assert _remembered(locks) == 1
    with pytest.raises(aiolock.LockLostError, match="was lost"):
        await permit.release()
    assert _remembered(locks) == 0  # was kept until the cap before the fix
    with pytest.raises(aiolock.LockLostError):  # the Permit itself still says so
        await permit.release()


async def test_extending_a_lost_permit_forgets_it(locks: aiolock.LockManager) -> None:
    sem = locks.semaphore("lost-extend", 2)
    permit = await sem.acquire(lease=30)
    assert await sem.force_release()
    with pytest.raises(aiolock.LockLostError):
        await permit.extend(30)
    assert _remembered(locks) == 0


def _handle(locks: aiolock.LockManager, kind: str) -> Any:
    if kind == "lock":
        return locks.lock("cancelled-lost")
    if kind == "semaphore":
        return locks.semaphore("cancelled-lost", 2)
    return locks.multi_lock(["cancelled-lost-a", "cancelled-lost-b"])


@pytest.mark.parametrize("kind", ["lock", "semaphore", "multi"])
async def test_a_block_cancelled_from_outside_while_lost_forgets_and_frees_it(
    locks: aiolock.LockManager, redis: Redis, kind: str
) -> None:
    """The loss is noticed on this side while Redis still has the hold (as when renewal
    is cut off), and a cancellation from outside ends the block: the registry forgets
    the hold, and Redis is freed in the background rather than when the lease ends."""
    handle = _handle(locks, kind)
    entered = asyncio.Event()

    async def body() -> None:
        async with handle:
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), 10)
    registry = _engine(locks).registry
    holds = list(registry)
    assert holds
    keys = [hold.keys.lock for hold in holds]
    registry.lose(holds[0], "test: renewal was cut off")  # cancels the body (ours)
    task.cancel()  # and one from outside before the body runs: that one goes on
    # Python 3.10 keeps no count of cancellations: a second cancel() before the task runs
    # is merged into the first, whose message names the loss, so the block ends with
    # LockLostError there. Either way the hold must be forgotten and freed.
    ends = (asyncio.CancelledError, aiolock.LockLostError)
    with pytest.raises(asyncio.CancelledError if sys.version_info >= (3, 11) else ends):
        await asyncio.wait_for(task, 10)
    assert _remembered(locks) == 0  # kept until the cap before the fix
    for key in keys:  # the lease is 30 s: freed well before it ends
        assert await _gone(redis, key), f"{key} was not freed after the block ended"


async def test_a_task_that_ends_after_a_loss_leaves_nothing_remembered(
    locks: aiolock.LockManager,
) -> None:
    """A task that never calls release() after its hold was lost: once it has ended,
    no task can ask about the loss, so it is not kept."""
    lock = locks.lock("lost-then-ended")
    lost = asyncio.Event()

    async def holder() -> None:
        await lock.acquire()
        await lost.wait()

    task = asyncio.create_task(holder())
    for _ in range(500):
        if await lock.locked():
            break
        await asyncio.sleep(0.01)
    assert await lock.force_release()
    assert _remembered(locks) == 1
    lost.set()
    await asyncio.wait_for(task, 10)
    await asyncio.sleep(0)  # the task's done callbacks run one loop step after it ends
    assert _remembered(locks) == 0
