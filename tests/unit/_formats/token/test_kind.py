"""``wire="token"``: aiolock and redis-py's ``Lock`` (sync and asyncio) on one lock name.

Every test runs against the session's own redis-server and the real redis-py ``Lock``;
lock names are the raw names other clients use, so each test makes its own. Child
processes (the mixed fleet) are :mod:`tests._children.wire_fleet`, stopped by their pids.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import anyio
import pytest
import redis
from redis.asyncio import Redis
from redis.exceptions import LockNotOwnedError

import aiolock
from aiolock._engine.kind import ReleaseStatus
from aiolock._formats.foreign import POLL_FIRST, POLL_MAX, PollBackoff, aux_base, cluster_hash_tag
from aiolock._formats.token.kind import TokenLockKind
from tests._support.helpers import counting_client, eventually, unchanged_for, within
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
    async with aiolock.LockManager(redis, prefix=prefix, wire="token", lease=10.0) as manager:
        yield manager


# -- layout ---------------------------------------------------------------------------------


async def test_the_lock_is_a_token_string_at_the_name_itself(
    locks: aiolock.LockManager, admin: Redis, name: str, prefix: str
) -> None:
    lock = locks.lock(name)
    assert lock.key == name
    async with lock:
        token = await text(admin, name)
        assert token.startswith(f"aiolock:{{{prefix}}}:")
        assert 5000 < await admin.pttl(name) <= 10000  # the manager's lease
        async with lock:  # re-entered in the process: the same token, nothing added
            assert await text(admin, name) == token
            assert await lock.hold_count() == 2
        assert await admin.get(name) is not None  # a nested release keeps it
        assert await lock.hold_count() == 1
    assert await admin.exists(name) == 0  # the final release deletes it
    assert await lock.hold_count() == 0
    # Each acquisition writes a new token.
    async with lock:
        assert await text(admin, name) != token


async def test_a_fixed_lease_is_the_keys_px(
    locks: aiolock.LockManager, admin: Redis, name: str
) -> None:
    # Not the manager's 10 s; long enough that no stall of a loaded machine ends it here.
    async with locks.lock(name, lease=4.0) as lock:
        assert 0 < await admin.pttl(name) <= 4000
        await lock.extend(8.0)
        assert 4000 < await admin.pttl(name) <= 8000


async def test_no_fencing_tokens_and_no_other_kinds(locks: aiolock.LockManager, name: str) -> None:
    lock = locks.lock(name)
    async with lock:
        with pytest.raises(aiolock.WireFormatError, match="'token' wire format have no fencing"):
            _ = lock.fencing_token
    with pytest.raises(aiolock.WireFormatError, match="fencing"):
        _ = locks.multi_lock([name, f"{name}2"]).fencing_tokens
    for what, make in (
        ("fair lock", lambda: locks.fair_lock(name)),
        ("read-write lock", lambda: locks.rw_lock(name)),
        ("semaphore", lambda: locks.semaphore(name, 2)),
    ):
        with pytest.raises(aiolock.WireFormatError, match=f"'token' wire format has no {what}"):
            make()
    # The manager's own format stays available per lock.
    assert locks.fair_lock(name, wire="aiolock").name == name


async def test_a_key_of_another_type_is_reported(
    locks: aiolock.LockManager, admin: Redis, name: str
) -> None:
    await admin.rpush(name, "x")
    with pytest.raises(aiolock.LockKeyTypeError, match="holds a list"):
        await locks.lock(name).acquire(timeout=0)
    with pytest.raises(aiolock.LockKeyTypeError, match="holds a list"):
        await locks.lock(name).hold_count()
    await admin.delete(name)


def test_auxiliary_keys_share_the_names_slot_and_never_collide() -> None:
    from redis.crc import key_slot

    names = ["job", "{a}x", "x{a}", "a{b{c}d", "{}x", "x}", "}x", "~a", "{a}x:released", "a:5:b"]
    bases = {aux_base("p", "token", n) for n in names}
    assert len(bases) == len(names)
    assert aux_base("p", "token", "job") == "p:token:{job}"
    assert aux_base("p", "token", "{a}x") == "p:token:{a}:4:{a}x"
    assert aux_base("p", "token", "{}x").endswith("#3:{}x")
    assert cluster_hash_tag("{}x") is None
    for n in names:
        assert key_slot(aux_base("p", "token", n).encode()) == key_slot(n.encode()), n


def test_the_poll_backs_off_to_its_bound_whoever_holds_and_restarts_for_a_new_wait() -> None:
    backoff = PollBackoff()
    now, waits = 100.0, []
    for _ in range(8):
        waits.append(backoff.next("n", 0, now))
        now += waits[-1]
    assert waits[0] == POLL_FIRST
    assert waits == sorted(waits)
    assert waits[-1] == POLL_MAX
    assert sum(1 for w in waits if w < POLL_MAX) == 4  # 10, 20, 40, 80 ms, then 100 ms
    assert backoff.next("n", 0.005, now) == 0.005  # never past the holder's lease
    now += POLL_MAX
    assert backoff.next("n", 0, now) == POLL_MAX  # the same wait goes on
    assert backoff.next("n", 0, now + POLL_MAX + PollBackoff.RESTART + 0.01) == POLL_FIRST


# -- against redis-py's Lock -----------------------------------------------------------------


async def test_aiolock_and_redis_py_locks_exclude_each_other_both_ways(
    locks: aiolock.LockManager, redis: Redis, sync_redis: redis.Redis, name: str
) -> None:
    lock = locks.lock(name)
    async with lock:
        assert not sync_redis.lock(name, timeout=5).acquire(blocking=False)
        assert not await redis.lock(name, timeout=5).acquire(blocking=False)
    sync_lock = sync_redis.lock(name, timeout=5)
    assert sync_lock.acquire(blocking=False)
    assert not await lock.try_acquire()
    assert await lock.locked()
    assert 0 < (await lock.ttl() or 0) <= 5
    sync_lock.release()
    async_lock = redis.lock(name, timeout=5)
    assert await async_lock.acquire(blocking=False)
    assert not await lock.try_acquire()
    await async_lock.release()
    assert await lock.try_acquire()
    await lock.release()


async def test_an_aiolock_waiter_gets_the_lock_within_the_poll_bound_after_redis_py_releases(
    locks: aiolock.LockManager, redis: Redis, sync_redis: redis.Redis, name: str, polls: Polls
) -> None:
    """The poll bound by counts: the waiter polls at most POLL_MAX apart, and after the
    release only the poll already on its way can fail; the next one takes the lock."""
    sync_holder, async_holder = sync_redis.lock(name, timeout=30), redis.lock(name, timeout=30)
    for client in ("sync", "asyncio"):
        if client == "sync":
            assert sync_holder.acquire(blocking=False)
        else:
            assert await async_holder.acquire(blocking=False)
        waiter = asyncio.create_task(take(locks.lock(name)))
        await polls.at_bound()
        assert not waiter.done()
        polled, released = len(polls.waits), time.monotonic()
        if client == "sync":
            sync_holder.release()
        else:
            await async_holder.release()
        waited = await within(waiter, what=f"the waiter after the {client} release") - released
        assert len(polls.waits) - polled <= 1, polls.waits[polled:]
        polls.check_bound()
        # not the holder's 30 s lease, with room for a loaded machine
        assert waited < 5.0, f"the waiter got the lock {waited:.2f} s after the release"
        polls.waits.clear()


async def test_a_redis_py_waiter_gets_the_lock_when_aiolock_releases(
    locks: aiolock.LockManager, redis: Redis, sync_redis: redis.Redis, name: str
) -> None:
    lock = locks.lock(name)
    await lock.acquire()
    # Acquired and released in asyncio.to_thread calls, which need not run on the same
    # worker thread (on a loaded machine they often do not): the token must not be kept
    # thread-locally, redis-py's default, or the release finds none.
    sync_lock = sync_redis.lock(name, timeout=5, sleep=0.05, thread_local=False)
    sync_waiter = asyncio.create_task(asyncio.to_thread(sync_lock.acquire, blocking_timeout=10))
    await asyncio.sleep(0.3)
    assert not sync_waiter.done()
    released = time.monotonic()
    await lock.release()
    assert await sync_waiter is True
    # Its own pace (a poll every 50 ms), not the 30 s lease: the renewed hold never
    # expired. 5 s leaves a loaded machine room.
    assert time.monotonic() - released < 5.0
    await asyncio.to_thread(sync_lock.release)
    # And the asyncio client, in the same test.
    await lock.acquire()
    async_lock = redis.lock(name, timeout=5, sleep=0.05)
    async_waiter = asyncio.create_task(async_lock.acquire(blocking_timeout=10))
    await asyncio.sleep(0.3)
    assert not async_waiter.done()
    await lock.release()
    assert await async_waiter is True
    await async_lock.release()


async def test_redis_py_cannot_release_or_extend_aiolocks_hold(
    locks: aiolock.LockManager, redis: Redis, name: str
) -> None:
    async with locks.lock(name):
        intruder = redis.lock(name, timeout=5)
        intruder.local.token = b"not-the-token"
        with pytest.raises(LockNotOwnedError):
            await intruder.release()
        assert await redis.exists(name) == 1


@pytest.mark.processes
async def test_a_crashed_redis_py_holders_lease_expires_and_aiolock_takes_over(
    locks: aiolock.LockManager, redis_url: str, prefix: str, name: str, polls: Polls
) -> None:
    # A holder in another process that dies (SIGKILL, this test's own child) mid-hold.
    await check_crashed_holder_taken_over(locks, redis_url, prefix, name, "redispy-sync", polls)


async def test_a_waiter_behind_aiolock_sleeps_on_pubsub_and_polls_only_behind_redis_py(
    redis_url: str, prefix: str, redis: Redis, name: str, polls: Polls
) -> None:
    """The cost of waiting: no polling while an aiolock client holds the lock; while
    redis-py holds it, attempts settle at 1 / POLL_MAX per second per waiting name."""
    counted, trips = counting_client(redis_url)
    async with (
        aiolock.LockManager(redis, prefix=prefix, wire="token") as holder,
        aiolock.LockManager(counted, prefix=prefix, wire="token") as waiting,
    ):
        held = holder.lock(name)
        await held.acquire()
        waiter = asyncio.create_task(take(waiting.lock(name)))
        # subscribed, and its attempt after the confirmation is over: asleep
        await eventually(
            lambda: waiting.statistics().hub.subscriptions == 1, what="the waiter's subscription"
        )
        await eventually(unchanged_for(lambda: trips.sends), what="the waiter to go to sleep")
        before = trips.sends
        await asyncio.sleep(0.6)
        assert trips.sends - before == 0  # asleep on pub/sub
        released = time.monotonic()
        await held.release()
        # woken by the release message, with room for a loaded machine: not the 30 s lease
        woke = await waiter - released
        assert woke < 5.0, f"the waiter got the lock {woke:.2f} s after the release"

        foreign = redis.lock(name, timeout=10)
        assert await foreign.acquire(blocking=False)
        waiter = asyncio.create_task(take(waiting.lock(name)))
        await polls.at_bound()  # past the backoff's ramp
        before, started = trips.sends, time.monotonic()
        await asyncio.sleep(1.2)
        rate = (trips.sends - before) / (time.monotonic() - started)
        # One attempt per POLL_MAX at most (a late timer only lowers the rate).
        assert 0 < rate <= 1 / POLL_MAX + 1, rate
        await foreign.release()
        await waiter


async def test_a_name_with_a_hash_tag_works_end_to_end(
    redis_url: str, redis: Redis, prefix: str, admin: Redis
) -> None:
    """The release channel of a braced name (``P:token:{tag}:<len>:name``) is the one its
    waiters subscribe to: a waiter in another manager is woken by the release message."""
    name = f"{{{prefix}}}:order:{{7}}"
    async with (
        aiolock.LockManager(redis, prefix=prefix, wire="token") as holder,
        aiolock.LockManager.from_url(redis_url, prefix=prefix, wire="token") as waiting,
    ):
        held = holder.lock(name)
        await held.acquire()
        assert await admin.exists(name) == 1
        waiter = asyncio.create_task(take(waiting.lock(name)))
        await eventually(
            lambda: waiting.statistics().hub.subscriptions == 1, what="the waiter's subscription"
        )
        released = time.monotonic()
        await held.release()
        # not the 30 s lease, with room for a loaded machine
        woke = await waiter - released
        assert woke < 5.0, f"the waiter got the lock {woke:.2f} s after the release"
        assert waiting.statistics().hub.messages >= 1  # woken by the message, not a poll


async def test_a_timeout_behind_a_redis_py_holder_is_kept(
    locks: aiolock.LockManager, redis: Redis, name: str
) -> None:
    foreign = redis.lock(name, timeout=30)  # its lease cannot end within the bound below
    assert await foreign.acquire(blocking=False)
    started = time.monotonic()
    with pytest.raises(aiolock.LockTimeoutError, match="token lock"):
        await locks.lock(name).acquire(timeout=0.3)
    took = time.monotonic() - started
    assert 0.3 <= took <= 0.3 + 3.0, f"a 0.3 s timeout raised after {took:.2f} s"
    await foreign.release()


# -- cancellation and loss ---------------------------------------------------------------------


async def test_a_cancelled_acquire_leaves_nothing_held(
    locks: aiolock.LockManager, admin: Redis, name: str
) -> None:
    """Cancelled at several points of acquire (and of the release after it): whatever the
    attempt did is undone (or the release finished) before the cancellation lands."""
    cancelled = 0
    for delay in (0, 0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005):
        task = asyncio.create_task(take(locks.lock(name)))
        await asyncio.sleep(delay)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            cancelled += 1
        assert await admin.exists(name) == 0, delay
    assert cancelled > 0


async def test_a_cancelled_release_still_frees_the_lock(
    locks: aiolock.LockManager, admin: Redis, sync_redis: redis.Redis, name: str
) -> None:
    lock = locks.lock(name)
    for delay in (0, 0.0002, 0.0005, 0.001):
        await lock.acquire()
        with anyio.move_on_after(delay):  # cancels the release in this (the owner) task
            await lock.release()
        assert await admin.exists(name) == 0, delay
        assert await lock.hold_count() == 0
    assert sync_redis.lock(name, timeout=1).acquire(blocking=False)


async def test_a_resent_final_release_is_harmless(
    locks: aiolock.LockManager, redis: Redis, name: str
) -> None:
    lock = locks.lock(name)
    hold = await lock._acquire(0, None)
    kind = hold.kind
    assert isinstance(kind, TokenLockKind)
    first = await kind.release(hold, 1, "rid-1", None, False, False)
    foreign = redis.lock(name, timeout=5)
    assert await foreign.acquire(blocking=False)  # another client holds it meanwhile
    again = await kind.release(hold, 1, "rid-1", None, False, False)
    assert first.status is again.status is ReleaseStatus.RELEASED
    assert await redis.get(name) == foreign.local.token  # untouched
    await foreign.release()
    locks._open_engine().registry.remove(hold)


async def gone(client: Redis, key: str) -> bool:
    return await client.exists(key) == 0


async def test_a_hold_taken_over_after_its_lease_is_reported_lost(
    locks: aiolock.LockManager, redis: Redis, name: str
) -> None:
    lock = locks.lock(name, lease=0.2)
    await lock.acquire()
    await eventually(lambda: gone(redis, name), what="the 0.2 s lease to end")
    foreign = redis.lock(name, timeout=5)
    assert await foreign.acquire(blocking=False)
    with pytest.raises(aiolock.LockLostError):
        await lock.release()
    assert await redis.get(name) == foreign.local.token  # aiolock did not delete it
    await foreign.release()


async def test_a_renewed_hold_whose_key_is_replaced_cancels_the_body(
    redis: Redis, admin: Redis, prefix: str, name: str
) -> None:
    # A 3 s lease, renewed every second: with 0.6 s a loaded machine let the lease run
    # out before the key was replaced, and the replacing SET was cancelled with the body.
    async with aiolock.LockManager(redis, prefix=prefix, wire="token", lease=3.0) as locks:
        with pytest.raises(aiolock.LockLostError):
            async with locks.lock(name):
                # another client's token (shielded: the body's cancellation must not stop it)
                await asyncio.shield(admin.set(name, "someone-else"))
                await asyncio.sleep(30)  # the watchdog notices within lease / 3
                pytest.fail("the body should have been cancelled")
        assert await admin.get(name) == b"someone-else"
        await admin.delete(name)


async def test_force_release_deletes_a_redis_py_holders_lock(
    locks: aiolock.LockManager, redis: Redis, name: str
) -> None:
    foreign = redis.lock(name, timeout=5)
    assert await foreign.acquire(blocking=False)
    assert await locks.lock(name).force_release() is True
    with pytest.raises(LockNotOwnedError):
        await foreign.release()
    assert await locks.lock(name).force_release() is False


async def test_multi_lock_takes_token_locks_excluded_by_redis_py(
    locks: aiolock.LockManager, redis: Redis, prefix: str, name: str
) -> None:
    names = [f"{name}-a", f"{name}-b"]
    multi = locks.multi_lock(names)
    async with multi:
        for n in names:
            assert (await text(redis, n)).startswith(f"aiolock:{{{prefix}}}:")
            assert not await redis.lock(n, timeout=1).acquire(blocking=False)
    assert await redis.exists(*names) == 0
    foreign = redis.lock(names[1], timeout=5)
    assert await foreign.acquire(blocking=False)
    assert not await multi.try_acquire(timeout=0.2)
    assert await redis.exists(names[0]) == 0  # what it took is given back
    await foreign.release()


# -- the mixed fleet ---------------------------------------------------------------------------


@pytest.mark.processes
async def test_mixed_fleet_with_crashing_holders_never_overlaps(
    redis_url: str, prefix: str, name: str
) -> None:
    """aiolock (2 processes, 3 tasks) and redis-py (sync and asyncio, 2 processes), one
    process of each SIGKILLed mid-hold after a few sections: no overlap by the counter or
    by the logs, and while aiolock waited, no redis-py release left the lock free longer
    than the poll bound."""
    await check_mixed_fleet(
        redis_url, prefix, name, "token", ("redispy-sync", "redispy-async"), "redis-py"
    )
