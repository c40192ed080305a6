"""``extend(additional=...)``: add to the lease left in one step (redis-py's ``extend(t)``)."""

from __future__ import annotations

import asyncio
import math

import pytest
from redis.asyncio import Redis

import aiolock


async def test_additional_adds_to_the_lease_left_on_the_server(
    locks: aiolock.LockManager, redis: Redis
) -> None:
    lock = locks.lock("add", lease=30)
    async with lock:
        before = await redis.pttl(lock.key)
        await lock.extend(additional=20)
        after = await redis.pttl(lock.key)
        # Added, not set: setting would leave at most 20 s; only the time between the two
        # reads may be missing from the sum.
        assert before + 20_000 - 5_000 < after <= before + 20_000
        assert await lock.owned()


async def test_the_local_deadline_follows_the_addition(locks: aiolock.LockManager) -> None:
    # Watchdog and body guard use the manager's own deadline: had it stayed at the first
    # lease, the hold would be reported lost after 1 s although Redis still has it. (1 s,
    # not less: the extend must come before the first lease ends, on a loaded machine too.)
    lock = locks.lock("add-deadline", lease=1.0)
    async with lock:
        await lock.extend(additional=10)
        await asyncio.sleep(1.5)
        assert await lock.owned()
        ttl = await lock.ttl()
        assert ttl is not None and ttl > 5


@pytest.mark.parametrize("kind", ["fair", "redisson"])
async def test_a_fair_lock_and_a_redisson_lock_add_too(
    locks: aiolock.LockManager, redis: Redis, kind: str
) -> None:
    lock: aiolock.Lock
    if kind == "fair":
        lock = locks.fair_lock("add-fair", lease=30)
    else:
        lock = locks.lock("add-redisson", lease=30, wire="redisson")
    async with lock:
        before = await redis.pttl(lock.key)
        await lock.extend(additional=20)
        assert await redis.pttl(lock.key) > before + 15_000


async def test_refused_on_an_auto_renewed_hold(locks: aiolock.LockManager) -> None:
    lock = locks.lock("add-auto")
    async with lock:
        with pytest.raises(aiolock.LockError, match="renewed automatically"):
            await lock.extend(additional=5)
        assert await lock.owned()


async def test_a_lost_hold_raises_lock_lost(locks: aiolock.LockManager, admin: Redis) -> None:
    lock = locks.lock("add-lost", lease=30)
    await lock.acquire()
    await admin.delete(lock.key)  # an administrator deletes it behind our back
    with pytest.raises(aiolock.LockLostError, match="could not be extended"):
        await lock.extend(additional=5)
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.release()  # reported once, by the extend
    assert not await admin.exists(lock.key)  # and not brought back


async def test_not_held_raises_not_owned(locks: aiolock.LockManager) -> None:
    with pytest.raises(aiolock.LockNotOwnedError):
        await locks.lock("add-free", lease=5).extend(additional=1)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        (-1.0, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (True, TypeError),
        ("5", TypeError),
    ],
)
async def test_bad_additional_is_refused_at_the_call(
    locks: aiolock.LockManager, value: object, error: type[Exception]
) -> None:
    lock = locks.lock("add-bad", lease=5)
    async with lock:
        with pytest.raises(error, match="additional"):
            await lock.extend(additional=value)  # type: ignore[arg-type]
        assert await lock.owned()


async def test_exactly_one_of_lease_and_additional(locks: aiolock.LockManager) -> None:
    lock = locks.lock("add-both", lease=5)
    async with lock:
        with pytest.raises(TypeError, match="exactly one"):
            await lock.extend(5, additional=5)
        with pytest.raises(TypeError, match="exactly one"):
            await lock.extend()


@pytest.mark.parametrize("kind", ["read", "write", "token", "timestamp"])
async def test_kinds_that_cannot_add_say_so(redis: Redis, prefix: str, kind: str) -> None:
    async with aiolock.LockManager(redis, prefix=prefix) as locks:
        if kind in ("token", "timestamp"):
            lock = locks.lock(f"{prefix}:add-kind", lease=30, wire=kind)  # type: ignore[arg-type]
        else:
            rw = locks.rw_lock("add-kind", lease=30)
            lock = rw.read() if kind == "read" else rw.write()
        async with lock:
            with pytest.raises(aiolock.LockError, match=r"extend\(lease\) instead"):
                await lock.extend(additional=5)
            await lock.extend(20)  # setting the time left still works
            assert await lock.owned()


# -- a semaphore's permit (Permit.extend(additional=)) -----------------------------------


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
