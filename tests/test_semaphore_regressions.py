"""Regressions found by the adversarial review of the semaphore (issue 8), against a real
redis-server. Each test failed before its fix."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import aiolock
from aiolock._engine.kind import Attempt

from .faults.proxy import FaultProxy
from .helpers import eventually


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[FaultProxy]:
    """A FaultProxy in front of the suite's redis-server."""
    parts = urlsplit(redis_url)
    async with FaultProxy(parts.hostname or "127.0.0.1", parts.port or 6379) as started:
        yield started


@pytest.fixture
async def other(redis_url: str, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as manager:
        yield manager


# -- a Permit released by its ``async with`` block -------------------------------------


async def test_a_permit_released_by_its_block_cannot_be_released_again(
    locks: aiolock.LockManager,
) -> None:
    sem = locks.semaphore("block", 2)
    async with sem as permit:
        assert permit.held
    with pytest.raises(aiolock.LockNotOwnedError):
        await permit.release()  # returned silently before the fix
    with pytest.raises(aiolock.LockNotOwnedError):
        await permit.extend(1)
    assert await sem.available() == 2


async def test_a_permit_released_inside_its_block_is_not_reported_lost_on_exit(
    locks: aiolock.LockManager,
) -> None:
    sem = locks.semaphore("early", 2)
    async with sem as permit:
        await permit.release()  # give it back early; the block must not then fail
        assert not permit.held
    assert locks.statistics().lost.get("semaphore", 0) == 0
    assert await sem.available() == 2


# -- two unconfirmed releases of one task ------------------------------------------------


async def test_two_unconfirmed_releases_of_one_task_are_each_resent(
    proxy: FaultProxy, prefix: str, redis_url: str
) -> None:
    """The registry's parked index is keyed by (resource, owner): the second permit's
    parked release hid the first's, whose release() then said "not owned"."""
    client = Redis.from_url(proxy.url, retry=Retry(NoBackoff(), 0))
    try:
        async with aiolock.LockManager(client, prefix=prefix, command_timeout=0.3) as locks:
            sem = locks.semaphore("parked", 3)
            first, second = await sem.acquire(1), await sem.acquire(2)
            proxy.blackhole()
            for permit in (first, second):
                with pytest.raises(aiolock.LockConnectionError):
                    await asyncio.wait_for(permit.release(), 10)
            # Still unreachable: calling release() again resends it (and fails again).
            with pytest.raises(aiolock.LockConnectionError):
                await asyncio.wait_for(first.release(), 10)
            proxy.restore()
            for permit in (first, second):
                await asyncio.wait_for(permit.release(), 10)  # resent, or found done
                with pytest.raises(aiolock.LockNotOwnedError):
                    await permit.release()
            async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as direct:
                assert await direct.semaphore("parked", 3).available() == 3
    finally:
        proxy.restore()
        await client.aclose()


# -- a late undo of a waiter's earlier attempt -------------------------------------------


async def test_a_late_undo_of_an_earlier_attempt_never_takes_a_later_grant(
    locks: aiolock.LockManager, other: aiolock.LockManager, redis_url: str, prefix: str
) -> None:
    """A waiter keeps one field for its whole wait. When one of its attempts failed in
    flight and the undo could not be sent, the undo was retried in the background while
    the waiter tried again under the same field: the late undo then took the permits the
    waiter had since been granted, and another client could exceed the limit."""
    sem = locks.semaphore("late-undo", 2)
    kind: Any = sem._kind
    real_attempt, real_undo = kind.attempt, kind.undo
    calls = {"attempt": 0, "undo": 0}
    fail_next, let_undo = asyncio.Event(), asyncio.Event()

    async def attempt(a: Attempt) -> Any:
        calls["attempt"] += 1
        outcome = await real_attempt(a)
        if fail_next.is_set() and calls["undo"] == 0:  # it ran, but its reply is lost
            raise aiolock.LockConnectionError("reply lost (test)")
        return outcome

    async def undo(a: Attempt) -> bool:
        calls["undo"] += 1
        if calls["undo"] == 1:  # the undo cannot be sent now: retried in the background
            raise aiolock.LockConnectionError("undo not sent (test)")
        if calls["undo"] == 2:
            await let_undo.wait()  # the retry lands late
        result: bool = await real_undo(a)
        return result

    kind.attempt, kind.undo = attempt, undo
    holders = [await other.semaphore("late-undo", 2).acquire(1) for _ in range(2)]
    checked = asyncio.Event()

    async def wait_and_hold() -> bool:
        permit = await sem.acquire(2, timeout=10)  # a permit belongs to its task
        await checked.wait()
        held = permit.held
        await permit.release()
        return held

    waiter = asyncio.create_task(wait_and_hold())
    await eventually(lambda: locks.statistics().hub.subscriptions == 1, what="the waiter")
    await asyncio.sleep(0.1)
    fail_next.set()
    await holders[0].release()  # wakes the waiter: its attempt fails in flight
    await eventually(lambda: calls["undo"] == 2, what="the undo retried in the background")
    await asyncio.sleep(0.2)
    await holders[1].release()
    # Before the fix the waiter was granted now, and the undo then took its permits.
    # After it, the old field's claim (ahead of the new one) holds it until the undo lands.
    await asyncio.wait({waiter}, timeout=0.5)
    let_undo.set()
    await eventually(lambda: locks.statistics().held == 1, what="the waiter's grant")
    await eventually(lambda: locks.statistics().pending_cleanups == 0, what="the late undo")
    try:
        async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as third:
            # the waiter holds both permits: a third client must get none
            assert await third.semaphore("late-undo", 2).try_acquire(1) is None
    finally:
        checked.set()
    assert await asyncio.wait_for(waiter, 5)
