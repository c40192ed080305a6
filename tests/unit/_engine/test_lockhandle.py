"""Unit tests of :mod:`aiolock._engine.lockhandle`: :class:`~aiolock.Lock`, the plain
lock's handle, from which the fair lock's and the read-write lock's sides derive.

Its repr; ``extend(additional=...)`` adds to the lease left in one step (redis-py's
``extend(t)``), for every lock-like kind and format; the sides go through their own
``_acquire``; the hand-off calls check their arguments and refuse on every handle whose
kind is not ``detachable`` (the hand-off itself: ``tests/unit/_kinds/lock/test_handoff.py``);
``ttl()`` asks the kind for the lease left. FairLock and the sides are Locks, to
isinstance() and to mypy, which checks this file.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._kinds.rw.handle import _ReadSide, _WriteSide


async def test_the_handle(locks: aiolock.LockManager) -> None:
    lock = locks.lock("plain", timeout=3, lease=7)
    assert repr(lock) == "<Lock 'plain' timeout=3.0 lease=7.0>"
    async with lock as entered:
        assert entered is lock


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
        lock: aiolock.Lock
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


# -- what the kinds' handles share -------------------------------------------------------


def lock_of(lock: aiolock.Lock) -> aiolock.Lock:
    """*lock*, where a Lock is annotated: mypy checks the calls below."""
    return lock


def test_the_other_lock_like_handles_are_locks(locks: aiolock.LockManager) -> None:
    """FairLock and the read-write lock's sides derive from Lock, so a type checker takes
    them where a Lock is annotated (mypy runs over the tests: these lines fail it if they
    do not) and isinstance() says so; no ABC registration stands in for the class."""
    classes: list[type[aiolock.Lock]] = [aiolock.FairLock, _ReadSide, _WriteSide]
    for handle in classes:
        assert issubclass(handle, aiolock.Lock) and aiolock.Lock in handle.__mro__
    assert type(aiolock.Lock) is type  # a plain class: no ABC registration
    rw = locks.rw_lock("typed")
    fair: aiolock.Lock = locks.fair_lock("typed")
    read: aiolock.Lock = rw.read(timeout=1)
    for lock in (lock_of(fair), lock_of(read), lock_of(rw.write())):
        assert isinstance(lock, aiolock.Lock)
    assert not issubclass(aiolock.Semaphore, aiolock.Lock)
    assert not issubclass(aiolock.MultiLock, aiolock.Lock)


def test_the_sides_acquire_through_their_own_checks() -> None:
    """Issue 21 inlined Lock._acquire into acquire() and try_acquire(); the read-write
    lock's sides override _acquire (the upgrade refusal, the downgrade), so those two go
    through it for them. A fresh-clone CI run caught the sides skipping it."""
    assert aiolock.Lock._plain and aiolock.FairLock._plain
    assert not _ReadSide._plain and not _WriteSide._plain


async def test_the_hand_off_is_refused_after_the_arguments_are_checked(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("plain")
    await lock.acquire()
    token = await lock.detach()
    rw = locks.rw_lock("rw")
    for handle, what in (
        (locks.fair_lock("fair"), "FairLock 'fair'"),
        (rw.read(), "_ReadSide 'rw'"),
        (rw.write(), "_WriteSide 'rw'"),
    ):
        refusal = f"^{what} cannot be handed off: only a plain Lock"
        with pytest.raises(aiolock.LockError, match=refusal):
            await handle.detach(lease=-1)  # refused before the lease is looked at
        with pytest.raises(ValueError, match="lease"):
            await handle.adopt(token, lease=-1)
        with pytest.raises(ValueError, match="not a hand-off token"):
            await handle.adopt("nope")
        with pytest.raises(ValueError, match="not a hand-off token"):
            handle.adopted("nope")
        with pytest.raises(aiolock.LockError, match=refusal):
            await handle.adopt(token)
        with pytest.raises(aiolock.LockError, match=refusal):
            async with handle.adopted(token):
                pass
        assert not await handle.locked()
    await lock.adopt(token)  # none of that touched the detached hold
    await lock.release()


async def test_ttl_is_the_holders_lease_left(locks: aiolock.LockManager) -> None:
    lock = locks.lock("ttl", lease=30)
    assert await lock.ttl() is None  # nobody holds it (the state may outlive its holds)
    async with lock:
        ttl = await lock.ttl()
        assert ttl is not None and 20 < ttl <= 30
    assert await lock.ttl() is None


@pytest.mark.parametrize("wire", ["token", "redisson"])
async def test_ttl_of_another_wire_format_is_the_keys(
    locks: aiolock.LockManager, wire: str
) -> None:
    lock = locks.lock("ttl-wire", lease=30, wire=wire)  # type: ignore[arg-type]
    assert await lock.ttl() is None
    async with lock:
        ttl = await lock.ttl()
        assert ttl is not None and 20 < ttl <= 30


async def test_ttl_of_the_other_kinds_is_the_keys(locks: aiolock.LockManager) -> None:
    fair = locks.fair_lock("ttl", lease=30)
    assert await fair.ttl() is None  # nobody holds it
    async with fair:
        ttl = await fair.ttl()
        assert ttl is not None and 20 < ttl <= 30
    async with locks.rw_lock("ttl-rw").write(lease=30) as side:
        ttl = await side.ttl()
        assert ttl is not None and 20 < ttl <= 30
