"""``wire="timestamp"``: aiolock and the legacy SETNX/GETSET expiry lock on one name.

The legacy client is the recipe of the seed documents, written in
:mod:`tests._children.wire_fleet` (sync redis-py, the client's clock): here it runs in a
thread for the focused tests, and in other processes in the mixed fleet, each stopped by
its own pid.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis
from redis.asyncio import Redis

import aiolock
from tests._children.wire_fleet import legacy_release, legacy_try
from tests._support.helpers import eventually, within
from tests._support.wire_fleet import (
    Polls,
    check_crashed_holder_taken_over,
    check_mixed_fleet,
    take,
    text,
)


@pytest.fixture
async def locks(redis: Redis, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    # A 10 s lease: a loaded machine that stalls the renewals for seconds keeps the holds.
    async with aiolock.LockManager(redis, prefix=prefix, wire="timestamp", lease=10.0) as manager:
        yield manager


async def server_ms(client: Redis) -> int:
    seconds, micros = await client.time()
    return seconds * 1000 + micros // 1000


def legacy_acquire(client: redis.Redis, name: str, timeout_ms: int, within: float) -> str:
    """The legacy recipe's blocking acquire: retry every 10 ms."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = legacy_try(client, name, timeout_ms)
        if value is not None:
            return value
        time.sleep(0.01)
    raise AssertionError("the legacy client did not get the lock")


# -- layout ---------------------------------------------------------------------------------


async def test_the_lock_is_an_expiry_time_at_the_name_on_the_servers_clock(
    locks: aiolock.LockManager, admin: Redis, name: str, prefix: str
) -> None:
    lock = locks.lock(name)
    assert lock.key == name
    async with lock:
        # Both read in one MULTI: a renewal between two reads rewrites both (streak
        # attempt 18 read the value, then a renewal's record, 970 ms apart).
        async with admin.pipeline(transaction=True) as pipe:
            pipe.get(name)
            pipe.get(f"{prefix}:ts:{{{name}}}:holder")
            pipe.time()
            raw_value, raw_record, (seconds, micros) = await pipe.execute()
        value = int(raw_value)
        # TIME + lease, written earlier (by up to a stall of a loaded machine)
        assert -5000 <= value - (seconds * 1000 + micros // 1000 + 10000) <= 0
        assert 5000 < await admin.pttl(name) <= 10000
        record = raw_record.decode() if isinstance(raw_record, bytes) else raw_record
        assert record.startswith(f"{value} ")
        async with lock:
            assert await lock.hold_count() == 2
        assert await admin.exists(name) == 1  # a nested release keeps it
    assert await admin.exists(name, f"{prefix}:ts:{{{name}}}:holder") == 0
    assert await lock.hold_count() == 0


async def test_renewal_rewrites_the_expiry(
    locks: aiolock.LockManager, admin: Redis, name: str
) -> None:
    async with locks.lock(name):
        first = int(await text(admin, name))

        async def later() -> bool:  # the server's clock has moved on since the write
            return await server_ms(admin) + 10000 > first

        await eventually(later, what="the server's clock to pass a millisecond")
        # The watchdog's round (the one it runs every lease / 3), run here: no waiting
        # for its timer, which a loaded machine delays.
        assert await locks._open_engine().watchdog.renew_all()
        second = int(await text(admin, name))
        assert second > first
        assert second - await server_ms(admin) > 0  # never allowed to go stale
        assert locks.statistics().lost == {}


async def test_no_fencing_tokens_and_no_other_kinds(locks: aiolock.LockManager, name: str) -> None:
    async with locks.lock(name) as lock:
        with pytest.raises(aiolock.WireFormatError, match="'timestamp' wire format have no"):
            _ = lock.fencing_token
    for what, make in (
        ("fair lock", lambda: locks.fair_lock(name)),
        ("read-write lock", lambda: locks.rw_lock(name)),
        ("semaphore", lambda: locks.semaphore(name, 2)),
    ):
        with pytest.raises(aiolock.WireFormatError, match=f"'timestamp' wire format has no {what}"):
            make()


async def test_a_value_that_is_not_a_time_counts_as_held(
    locks: aiolock.LockManager, admin: Redis, name: str
) -> None:
    await admin.set(name, "not-a-number")
    assert not await locks.lock(name).try_acquire(timeout=0.1)
    assert await admin.get(name) == b"not-a-number"
    await admin.delete(name)


async def test_multi_lock_takes_timestamp_locks(
    locks: aiolock.LockManager, sync_redis: redis.Redis, name: str
) -> None:
    names = [f"{name}-a", f"{name}-b"]
    multi = locks.multi_lock(names)
    with pytest.raises(aiolock.WireFormatError, match="fencing"):
        _ = multi.fencing_tokens
    async with multi:
        for n in names:
            assert legacy_try(sync_redis, n, 5000) is None
    value = legacy_try(sync_redis, names[1], 5000)
    assert value is not None
    assert not await multi.try_acquire(timeout=0.2)
    assert sync_redis.exists(names[0]) == 0  # what it took is given back
    legacy_release(sync_redis, names[1], value)


async def test_the_token_and_timestamp_formats_exclude_each_other_on_one_name(
    locks: aiolock.LockManager, name: str
) -> None:
    """Both keep the lock at the raw name: each sees the other's value as a foreign
    holder's (a token is not a time; a time is not aiolock's token)."""
    stamped, tokened = locks.lock(name), locks.lock(name, wire="token")
    async with stamped:
        assert not await tokened.try_acquire()
    async with tokened:
        assert not await stamped.try_acquire()


# -- against the legacy client ---------------------------------------------------------------


async def test_aiolock_and_the_legacy_client_exclude_each_other_both_ways(
    locks: aiolock.LockManager, sync_redis: redis.Redis, name: str
) -> None:
    lock = locks.lock(name)
    async with lock:
        assert legacy_try(sync_redis, name, 5000) is None
    value = legacy_try(sync_redis, name, 5000)
    assert value is not None
    assert not await lock.try_acquire()
    legacy_release(sync_redis, name, value)
    assert await lock.try_acquire()
    await lock.release()


async def test_aiolock_takes_over_a_stale_legacy_lock_and_the_legacy_check_then_fails(
    locks: aiolock.LockManager, sync_redis: redis.Redis, name: str
) -> None:
    stale = str(int(time.time() * 1000) - 50)  # a holder that crashed: no TTL, in the past
    sync_redis.set(name, stale)
    async with locks.lock(name) as lock:
        assert int(sync_redis.get(name) or 0) > int(stale)
        assert legacy_try(sync_redis, name, 5000) is None  # not stale: refused
        assert await lock.hold_count() == 1


async def test_a_legacy_getset_that_lost_the_race_takes_aiolocks_hold_away_and_it_is_reported(
    redis: Redis, sync_redis: redis.Redis, prefix: str, name: str
) -> None:
    """The protocol's own hazard: a legacy client that saw a stale value GETSETs after
    aiolock took the lock over. Its check fails (it does not own the lock), but it has
    overwritten aiolock's expiry: aiolock's watchdog finds its hold gone, and cancels the
    body. Nobody holds the lock until the legacy value expires."""
    stale = str(int(time.time() * 1000) - 50)
    sync_redis.set(name, stale)
    seen = sync_redis.get(name)  # the legacy client's GET
    async with aiolock.LockManager(redis, prefix=prefix, wire="timestamp", lease=0.6) as locks:
        with pytest.raises(aiolock.LockLostError):
            async with locks.lock(name):
                late = str(int(time.time() * 1000) + 5000)
                old = sync_redis.getset(name, late)  # the legacy client's GETSET
                assert old != seen  # its check fails: it does not take the lock
                await asyncio.sleep(30)  # the watchdog notices within lease / 3
                pytest.fail("the body should have been cancelled")
        assert sync_redis.get(name) == late.encode()  # aiolock did not delete it
    sync_redis.delete(name)


async def test_an_expired_hold_never_deletes_a_later_value_even_an_equal_one(
    locks: aiolock.LockManager, admin: Redis, sync_redis: redis.Redis, prefix: str, name: str
) -> None:
    """aiolock's holder record lives as long as its value: once the value has passed,
    the same number written by a legacy client is not aiolock's."""
    # 1.5 s, not 0.2: the value is read while the hold lives, and a fresh-clone CI run
    # (stop 32) found the key already gone between the acquisition and that read
    lock = locks.lock(name, lease=1.5)
    await lock.acquire()
    value = await text(admin, name)

    async def gone() -> bool:  # key and record expire with the value
        return await admin.exists(name, f"{prefix}:ts:{{{name}}}:holder") == 0

    await eventually(gone, what="the 1.5 s lease to end")
    assert sync_redis.setnx(name, value)  # a legacy client writes the very same number
    with pytest.raises(aiolock.LockLostError):
        await lock.release()
    assert await text(admin, name) == value
    await admin.delete(name)


async def test_an_aiolock_waiter_gets_the_lock_within_the_poll_bound_after_a_legacy_release(
    locks: aiolock.LockManager, sync_redis: redis.Redis, name: str, polls: Polls
) -> None:
    """The poll bound by counts: the waiter polls at most POLL_MAX apart, and after the
    release only the poll already on its way can fail; the next one takes the lock."""
    value = legacy_try(sync_redis, name, 30000)
    assert value is not None
    waiter = asyncio.create_task(take(locks.lock(name)))
    await polls.at_bound()
    assert not waiter.done()
    polled, released = len(polls.waits), time.monotonic()
    legacy_release(sync_redis, name, value)
    waited = await within(waiter, what="the waiter after the legacy release") - released
    assert len(polls.waits) - polled <= 1, polls.waits[polled:]
    polls.check_bound()
    # not the holder's 30 s lease, with room for a loaded machine
    assert waited < 5.0, f"the waiter got the lock {waited:.2f} s after the release"


async def test_a_legacy_waiter_gets_the_lock_when_aiolock_releases(
    locks: aiolock.LockManager, sync_redis: redis.Redis, name: str
) -> None:
    lock = locks.lock(name)
    await lock.acquire()
    waiter = asyncio.create_task(asyncio.to_thread(legacy_acquire, sync_redis, name, 5000, 10))
    await asyncio.sleep(0.3)
    assert not waiter.done()
    released = time.monotonic()
    await lock.release()
    value = await waiter
    # Its own pace (a poll every 50 ms), not the 30 s lease: the renewed hold never
    # expired. 5 s leaves a loaded machine room.
    assert time.monotonic() - released < 5.0
    legacy_release(sync_redis, name, value)


async def test_a_crashed_legacy_holder_is_taken_over_once_its_expiry_passes(
    locks: aiolock.LockManager, redis_url: str, prefix: str, name: str, polls: Polls
) -> None:
    await check_crashed_holder_taken_over(locks, redis_url, prefix, name, "legacy", polls)


async def test_a_cancelled_acquire_or_release_leaves_nothing_held(
    locks: aiolock.LockManager, admin: Redis, prefix: str, name: str
) -> None:
    cancelled = 0
    for delay in (0, 0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005):
        task = asyncio.create_task(take(locks.lock(name)))
        await asyncio.sleep(delay)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            cancelled += 1
        assert await admin.exists(name, f"{prefix}:ts:{{{name}}}:holder") == 0, delay
    assert cancelled > 0


# -- the mixed fleet ---------------------------------------------------------------------------


@pytest.mark.processes
async def test_mixed_fleet_with_crashing_holders_never_overlaps(
    redis_url: str, prefix: str, name: str
) -> None:
    """aiolock (2 processes, 3 tasks) and two legacy clients, one process of each
    SIGKILLed mid-hold after a few sections: no overlap by the counter or by the logs,
    and while aiolock waited, no legacy release left the lock free longer than the poll
    bound."""
    await check_mixed_fleet(redis_url, prefix, name, "timestamp", ("legacy", "legacy"), "legacy")
