"""Unit tests of :mod:`aiolock._kinds.lock.handle`: what the plain lock's handle adds to
the lock API of :mod:`aiolock._engine.lockhandle` (its repr, the lease left of a key that
outlives its holds, and the Locks registered from the other kinds). The hand-off has
its own file, ``test_handoff.py``."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.lockhandle import LockHandle


async def test_the_handle(locks: aiolock.LockManager) -> None:
    lock = locks.lock("plain", timeout=3, lease=7)
    assert repr(lock) == "<Lock 'plain' timeout=3.0 lease=7.0>"
    assert isinstance(lock, LockHandle)
    async with lock as entered:
        assert entered is lock


async def test_ttl_is_the_holders_lease_left(locks: aiolock.LockManager, redis: Redis) -> None:
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


def test_the_other_lock_like_handles_are_locks() -> None:
    """FairLock and the read-write lock's sides derive from the engine's lock handle
    base, not from Lock (kinds do not import each other); aiolock/__init__.py registers
    them, so isinstance() and issubclass() answer as when they derived from Lock."""
    from aiolock._kinds.rw.handle import _ReadSide, _WriteSide

    for handle in (aiolock.FairLock, _ReadSide, _WriteSide):
        assert issubclass(handle, aiolock.Lock)
        assert aiolock.Lock not in handle.__mro__
    assert not issubclass(aiolock.Semaphore, aiolock.Lock)
    assert not issubclass(aiolock.MultiLock, aiolock.Lock)
