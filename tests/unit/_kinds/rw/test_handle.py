"""Unit tests of :mod:`aiolock._kinds.rw.handle`: the read-write lock's handle and its
two sides, the lock API with what a task may do with both (a downgrade granted at once,
never an upgrade). What the kind keeps in Redis is tested in ``test_kind.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

import aiolock
from tests._support.faults import bounded
from tests._support.helpers import eventually


@pytest.fixture
async def other(redis_url: str, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as manager:
        yield manager


async def can_write(manager: aiolock.LockManager, name: str = "doc") -> bool:
    side = manager.rw_lock(name).write()
    if await side.try_acquire():
        await side.release()
        return True
    return False


async def test_the_handles(locks: aiolock.LockManager) -> None:
    rw = locks.rw_lock("doc", timeout=3, lease=7)
    assert isinstance(rw, aiolock.ReadWriteLock)
    assert rw.name == "doc" and rw.key == f"{locks.prefix}:rw:{{doc}}"
    assert rw.read() is rw.read() and rw.write() is rw.write()  # the defaults' handles
    assert isinstance(rw.read(timeout=1), aiolock.Lock)
    assert "read side" in repr(rw.read()) and "write side" in repr(rw.write(lease=2))
    with pytest.raises(TypeError, match="lock name"):
        locks.rw_lock(7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        rw.read(timeout=-1)
    with pytest.raises(TypeError, match="lease"):
        rw.write(lease="long")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        locks.rw_lock("doc", timeout=-2)


async def test_an_upgrade_is_refused_at_once(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    rw = locks.rw_lock("doc")
    async with rw.read():
        started = time.monotonic()
        with pytest.raises(aiolock.LockError, match="holds the read side") as raised:
            await rw.write().acquire()
        assert "Release the read side first" in str(raised.value)
        with pytest.raises(aiolock.LockError, match="upgrading is not supported"):
            await rw.write(timeout=None).try_acquire()
        with pytest.raises(aiolock.LockError, match="holds the read side"):
            async with rw.write():
                pass
        # at once: the write side has no timeout, a wait would never end (the margin is
        # for a loaded machine)
        took = time.monotonic() - started
        assert took < 5.0, f"the three refusals took {took:.2f} s"
        assert await rw.read().hold_count() == 1  # the read hold is untouched
        assert not await can_write(other)
    assert locks.statistics().held == 0


async def test_a_downgrade_leaves_no_gap(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    rw = locks.rw_lock("doc")
    their = other.rw_lock("doc")
    await rw.write().acquire()
    order: list[str] = []

    async def their_writer() -> None:
        async with their.write(timeout=10):
            order.append("their writer")

    async def local_reader() -> None:  # queued in our own manager, behind our writer
        async with rw.read(timeout=10):
            order.append("local reader")

    stop = asyncio.Event()
    sneaked = 0

    async def poller() -> None:  # another client trying the write side all along
        nonlocal sneaked
        while not stop.is_set():
            side = their.write()
            if await side.try_acquire():
                sneaked += 1
                await side.release()
            await asyncio.sleep(0.005)

    writer = asyncio.create_task(their_writer())
    await eventually(lambda: other.statistics().claims == 1, what="their writer's claim")
    reader = asyncio.create_task(local_reader())
    await eventually(lambda: locks.statistics().hub.waiters == 1, what="the local reader")
    polling = asyncio.create_task(poller())
    # The downgrade: granted at once though a writer waits and a local reader queues.
    await bounded(rw.read().acquire(timeout=5), 1, "the downgrade")
    await rw.write().release()
    assert await rw.read().hold_count() == 1 and not await rw.write().owned()
    await asyncio.sleep(0.3)
    assert order == [] and sneaked == 0
    stop.set()
    await polling
    await rw.read().release()
    await bounded(asyncio.gather(writer, reader), 10, "the writer and the reader")
    assert order == ["their writer", "local reader"]  # the waiting writer went first
    assert sneaked == 0


async def test_a_writer_holding_both_sides_reenters_either(locks: aiolock.LockManager) -> None:
    rw = locks.rw_lock("doc")
    async with rw.write(), rw.read(), rw.write(), rw.read():
        assert await rw.write().hold_count() == 2
        assert await rw.read().hold_count() == 2
    assert locks.statistics().held == 0


def test_the_sides_are_locks() -> None:
    """Built on the engine's lock handle base, not on Lock (kinds do not import each
    other), the sides are registered as Locks (aiolock/__init__.py), as they were."""
    from aiolock._kinds.rw.handle import _ReadSide, _WriteSide

    assert issubclass(_ReadSide, aiolock.Lock) and issubclass(_WriteSide, aiolock.Lock)
    assert not issubclass(aiolock.ReadWriteLock, aiolock.Lock)
