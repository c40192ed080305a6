"""Cancellation at any await never leaves a lock held; releases are idempotent."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from redis.asyncio import Redis

import aiolock
from aiolock._kinds.lock.kind import ACQUIRE, RELEASE
from aiolock._redis.client import Client
from tests._support.helpers import eventually, within

NAMES = ("c0", "c1", "c2")


async def test_random_cancellations_leave_nothing_held(locks: aiolock.LockManager) -> None:
    rng = random.Random(20261120)

    async def user(name: str) -> None:
        async with locks.lock(name):
            await asyncio.sleep(rng.choice((0, 0, 0.001, 0.003)))

    cancelled = 0
    for _ in range(60):
        tasks = [asyncio.create_task(user(rng.choice(NAMES))) for _ in range(10)]
        await asyncio.sleep(rng.uniform(0, 0.004))
        for task in tasks:
            if rng.random() < 0.6:
                task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        cancelled += sum(isinstance(r, asyncio.CancelledError) for r in results)
        assert not [r for r in results if isinstance(r, Exception)], results
    assert cancelled > 100
    await eventually(lambda: locks.statistics().pending_cleanups == 0, what="cleanups")
    for name in NAMES:
        assert not await locks.lock(name).locked(), name
    stats = locks.statistics()
    assert stats.held == 0
    assert stats.hub.waiters == 0
    await eventually(lambda: locks.statistics().hub.queues == 0, what="queues to drain")


async def test_cancelling_a_release_still_releases(locks: aiolock.LockManager) -> None:
    lock = locks.lock("rel")
    for delay in (0, 0.0001, 0.0005, 0.001):
        await lock.acquire()
        task = asyncio.create_task(lock.release())
        await asyncio.sleep(delay)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        # Whether the release had been sent or not, no hold survives the cancelled call
        # unless the call was cancelled before it ever ran.
        if await lock.owned():
            assert locks.statistics().held == 1
            await lock.release()
        assert not await lock.locked()
        assert locks.statistics().held == 0


async def test_cancelled_waiters_leave_their_queue(locks: aiolock.LockManager) -> None:
    lock = locks.lock("leave")
    await lock.acquire()
    served: list[int] = []

    async def waiter(i: int) -> None:
        async with lock:
            served.append(i)

    tasks = []
    for i in range(20):  # one at a time, so that the queue order is known
        tasks.append(asyncio.create_task(waiter(i)))
        await eventually(lambda: locks.statistics().hub.waiters == len(tasks), what="a waiter")
    for task in tasks[::2]:
        task.cancel()
    await asyncio.gather(*tasks[::2], return_exceptions=True)
    assert locks.statistics().hub.waiters == 10
    await lock.release()
    await within(asyncio.gather(*tasks[1::2]), what="the 10 waiters left to be served")
    assert served == list(range(1, 20, 2))  # first in, first out
    assert not await lock.locked()
    await eventually(lambda: locks.statistics().hub.queues == 0, what="queues to drain")


async def test_a_resent_release_is_idempotent(redis: Redis, prefix: str) -> None:
    """redis-py resends a command after a dropped connection: the script must not count twice."""
    client = Client(redis)
    lock = f"{prefix}:lock:{{idem}}"
    owner = "owner-1"
    token = await client.run(
        ACQUIRE, (lock, f"{lock}:void:1", f"{lock}:turns"), (owner, 5000, 0, "m")
    )
    assert isinstance(token, int)
    code, count = await client.run(
        ACQUIRE, (lock, f"{lock}:void:2", f"{lock}:turns"), (owner, 5000, 1, "m")
    )
    assert (code, count) == (2, 2)
    # the same re-entry sent twice counts once
    code, count = await client.run(
        ACQUIRE, (lock, f"{lock}:void:2", f"{lock}:turns"), (owner, 5000, 1, "m")
    )
    assert (code, count) == (2, 2)

    def release(count: int) -> tuple[tuple[str, ...], tuple[str | int, ...]]:
        # how the state begins with one hold, token, keep, count, message, no successor
        return (lock,), (f"{owner}|1|{token}|", token, "60000", count, "m", "", 0, 0, 0)

    assert await client.run(RELEASE, *release(2)) == [1, 1]
    assert await client.run(RELEASE, *release(2)) == [1, 1]  # resent: still 1
    assert await client.run(RELEASE, *release(1)) == 0  # released, nobody heard it
    # Resent: released (issue 21: the token lies in the epoch's released range; no key
    # per release, so any resend of this hold's final release answers so)
    assert await client.run(RELEASE, *release(1)) == [2, 0]
    assert await redis.get(lock) == f"|{token}|{token}".encode()  # the last token kept


async def test_a_resent_new_acquisition_counts_once(redis: Redis, prefix: str) -> None:
    """The resend answers 'acquired' again, with a fresh, larger token, and counts once."""
    client = Client(redis)
    lock = f"{prefix}:lock:{{tok}}"
    keys = (lock, f"{lock}:void:9", f"{lock}:turns")
    first = await client.run(ACQUIRE, keys, ("o", 5000, 0, "m"))  # the token alone
    again = await client.run(ACQUIRE, keys, ("o", 5000, 0, "m"))
    assert again[0] == 1
    assert again[1] > first
    state: Any = await redis.get(lock)
    assert state.startswith(b"o|1|")  # one hold, counted once


async def test_another_clients_void_markers_never_void_our_attempts(
    locks: aiolock.LockManager, redis: Redis
) -> None:
    """Regression: void markers were numbered per client, so one process's cancelled
    attempt #n voided attempt #n of another, which then slept a whole lease."""
    lock = locks.lock("voids")
    other_id = "0" * 32
    for n in range(1, 200):  # markers another client's cancelled attempts may leave
        await redis.set(f"{lock.key}:void:{other_id}:{n}", "1", px=60_000)
        await redis.set(f"{lock.key}:void:{n}", "1", px=60_000)
    for _ in range(20):
        assert await lock.try_acquire()
        await lock.release()
