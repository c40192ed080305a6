"""The contract every lock kind keeps, as one suite parametrised over the kinds.

Each kind is described by a :class:`Case`: how to make a handle on a name, how to
acquire and release through it, and a *probe*: the exclusive counterpart that a hold of
the handle must keep out (another lock on the name for a lock, the write side for a read
hold, the last permit for a semaphore). The probe runs in a second manager, so every
check is of what Redis grants, not of what one client believes.

What only one kind promises is tested in that kind's own module.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from tests._support.helpers import counting_client, eventually, unchanged_for

#: A handle on one name: what the case's acquire/release and ``async with`` work on.
Handle = Any


@dataclass(frozen=True)
class Case:
    id: str
    #: a handle on *name* in *manager* (with the manager's defaults)
    make: Callable[[aiolock.LockManager, str], Handle]
    #: acquire through *handle* within *timeout*; returns what release needs
    acquire: Callable[[Handle, float | None], Coroutine[Any, Any, Any]]
    #: release what acquire returned
    release: Callable[[Handle, Any], Awaitable[None]]
    #: a handle (in another manager) that a hold made by *make* must keep out
    probe: Callable[[aiolock.LockManager, str], Handle]


async def _lock_acquire(handle: aiolock.Lock, timeout: float | None) -> None:
    await handle.acquire(timeout=timeout)


async def _lock_release(handle: aiolock.Lock, _: object) -> None:
    await handle.release()


async def _multi_acquire(handle: aiolock.MultiLock, timeout: float | None) -> None:
    await handle.acquire(timeout=timeout)


async def _multi_release(handle: aiolock.MultiLock, _: object) -> None:
    await handle.release()


async def _sem_acquire(handle: aiolock.Semaphore, timeout: float | None) -> aiolock.Permit:
    return await handle.acquire(timeout=timeout)


async def _sem_release(_: aiolock.Semaphore, permit: aiolock.Permit) -> None:
    await permit.release()


def _raw_lock(wire: Any) -> Callable[[aiolock.LockManager, str], aiolock.Lock]:
    return lambda m, n: m.lock(f"{m.prefix}:{n}", wire=wire)


CASES = [
    Case(
        id="lock",
        make=lambda m, n: m.lock(n),
        acquire=_lock_acquire,
        release=_lock_release,
        probe=lambda m, n: m.lock(n),
    ),
    Case(
        id="multi_lock",
        # The probe is a plain lock on the name taken last, so a waiting multi-lock holds
        # the first name while it waits: that hold must be given back too.
        make=lambda m, n: m.multi_lock([f"{n}-2", f"{n}-1"]),
        acquire=_multi_acquire,
        release=_multi_release,
        probe=lambda m, n: m.lock(f"{n}-2"),
    ),
    # limit=1, so that the probe (the last permit) is exclusive
    Case(
        id="semaphore",
        make=lambda m, n: m.semaphore(n, limit=1),
        acquire=_sem_acquire,
        release=_sem_release,
        probe=lambda m, n: m.semaphore(n, limit=1),
    ),
    # The read-write lock's sides: a read hold keeps a writer out, a write hold keeps
    # another writer out. (A read probe cannot serve the write case: tests probe with it
    # while another probe holds, and readers share. tests/unit/_kinds/rw/test_kind.py
    # shows that a write hold keeps readers out.)
    Case(
        id="read",
        make=lambda m, n: m.rw_lock(n).read(),
        acquire=_lock_acquire,
        release=_lock_release,
        probe=lambda m, n: m.rw_lock(n).write(),
    ),
    Case(
        id="write",
        make=lambda m, n: m.rw_lock(n).write(),
        acquire=_lock_acquire,
        release=_lock_release,
        probe=lambda m, n: m.rw_lock(n).write(),
    ),
    Case(
        id="fair lock",
        make=lambda m, n: m.fair_lock(n),
        acquire=_lock_acquire,
        release=_lock_release,
        probe=lambda m, n: m.fair_lock(n),
    ),
    # The formats shared with other clients keep the lock at the raw name: the name is
    # made under the test's prefix, so that tests never share it.
    *(
        Case(
            id=f"{wire} lock",
            make=_raw_lock(wire),
            acquire=_lock_acquire,
            release=_lock_release,
            probe=_raw_lock(wire),
        )
        for wire in ("token", "timestamp")
    ),
]


@pytest.fixture(params=CASES, ids=[case.id for case in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    param: Case = request.param
    return param


@pytest.fixture
async def other(redis_url: str, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    """A second manager on the same keys: another process, as far as Redis can tell."""
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as manager:
        yield manager


async def probe_free(case: Case, manager: aiolock.LockManager, name: str) -> bool:
    """Whether *manager* can get the probe on *name* at once (it gives it back)."""
    probe = case.probe(manager, name)
    try:
        got = await case.acquire(probe, 0)
    except aiolock.LockTimeoutError:
        return False
    await case.release(probe, got)
    return True


async def test_a_hold_keeps_the_probe_out(
    case: Case, locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    handle = case.make(locks, "held")
    got = await case.acquire(handle, 0)
    assert not await probe_free(case, other, "held")
    await case.release(handle, got)
    assert await probe_free(case, other, "held")


async def test_a_cancelled_acquire_leaves_nothing_held(
    case: Case, locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    blocker = case.probe(other, "c")
    blocked = await case.acquire(blocker, 0)
    waiter = asyncio.create_task(case.acquire(case.make(locks, "c"), None))
    await eventually(lambda: locks.statistics().hub.waiters == 1, what="a waiter")
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await case.release(blocker, blocked)
    assert await probe_free(case, other, "c")
    stats = locks.statistics()
    assert (stats.held, stats.hub.waiters, stats.claims) == (0, 0, 0)


async def test_a_loss_cancels_the_body_and_raises_lock_lost(
    case: Case, redis_url: str, prefix: str, admin: Redis
) -> None:
    # renewed 1.5 s leases: the structure is still there to delete after a late round
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=1.5) as short:
        body_cancelled = False
        with pytest.raises(aiolock.LockLostError):
            async with case.make(short, "gone"):
                try:
                    # Another client deletes the structure (an administrator, an eviction).
                    # The loss may be noticed before the delete's own reply is read (a
                    # renewal's reply on another connection): the body is cancelled there.
                    await admin.delete(*[k async for k in admin.scan_iter(f"{prefix}:*")])
                    await asyncio.sleep(30)  # the loss, not the body's end, must end it
                except asyncio.CancelledError:
                    body_cancelled = True
                    raise
        assert body_cancelled
        assert sum(short.statistics().lost.values()) >= 1


async def test_a_hold_lost_before_its_acquire_returns_is_never_used(
    case: Case, redis_url: str, prefix: str, admin: Redis, other: aiolock.LockManager
) -> None:
    # The server is paused past the lease, so the grant's reply comes after the lease
    # ran out by the client's clock: the hold is lost before its body could begin, and
    # the body used to start anyway (under a multi-lock it ran to its end uncancelled).
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=0.3) as short:
        handle = case.make(short, "late")
        await short.ping()  # connected, so the pause delays the acquire itself
        ran = False
        await admin.client_pause(1200, all=True)
        with pytest.raises(aiolock.LockLostError):
            async with handle:
                ran = True
        assert not ran
        assert short.statistics().held == 0
        await admin.client_pause(1200, all=True)
        with pytest.raises(aiolock.LockLostError):
            await case.acquire(handle, None)  # an acquire never returns a lost hold
        assert short.statistics().held == 0
        for _ in range(200):  # freed in the background, or expired by its lease
            if await probe_free(case, other, "late"):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the lost hold stayed in Redis")


async def test_closing_the_manager_fails_its_waiters(
    case: Case, redis_url: str, prefix: str, other: aiolock.LockManager
) -> None:
    blocker = case.probe(other, "closing")
    blocked = await case.acquire(blocker, 0)
    manager = aiolock.LockManager.from_url(redis_url, prefix=prefix)
    await manager.__aenter__()
    waiter = asyncio.create_task(case.acquire(case.make(manager, "closing"), None))
    await eventually(lambda: manager.statistics().hub.waiters == 1, what="a waiter")
    await manager.aclose()
    with pytest.raises(aiolock.ManagerNotOpenError):
        await waiter
    await case.release(blocker, blocked)
    assert await probe_free(case, other, "closing")


async def test_a_repeated_release_is_harmless(
    case: Case, locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    handle = case.make(locks, "twice")
    got = await case.acquire(handle, 0)
    await case.release(handle, got)
    probe = case.probe(other, "twice")
    taken = await case.acquire(probe, 0)  # someone else holds it now
    with pytest.raises(aiolock.LockNotOwnedError):
        await case.release(handle, got)
    assert not await probe_free(case, locks, "twice")  # the other hold is intact
    await case.release(probe, taken)


async def test_a_finished_owner_task_frees_its_holds(
    case: Case,
    locks: aiolock.LockManager,
    other: aiolock.LockManager,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def forgetful() -> None:
        await case.acquire(case.make(locks, "forgotten"), 0)

    with caplog.at_level(logging.WARNING, logger="aiolock"):
        await asyncio.create_task(forgetful())
        await eventually(lambda: locks.statistics().pending_cleanups == 0, what="cleanups")
        for _ in range(100):
            if await probe_free(case, other, "forgotten"):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the hold of the finished task was not released")
    assert "forgotten" in caplog.text
    assert locks.statistics().released_on_task_exit >= 1  # a multi-lock has several


async def test_waiting_sends_no_commands(
    case: Case, redis_url: str, prefix: str, other: aiolock.LockManager
) -> None:
    blocker = case.probe(other, "quiet")
    blocked = await case.acquire(blocker, 0)
    client, trips = counting_client(redis_url)
    try:
        async with aiolock.LockManager(client, prefix=prefix) as manager:

            async def take_and_give_back() -> None:
                handle = case.make(manager, "quiet")
                await case.release(handle, await case.acquire(handle, None))

            waiter = asyncio.create_task(take_and_give_back())
            await eventually(lambda: manager.statistics().hub.subscriptions == 1, what="sub")
            # The head's retry after the confirmation; and the first refresh of a kind
            # with claims (within a third of a second), whose script the server may
            # still have to load (three round trips, once): waited out, however long a
            # loaded machine makes them.
            await eventually(unchanged_for(lambda: trips.sends, 0.5), what="the first commands")
            before = trips.sends
            await asyncio.sleep(2.0)
            # Kinds with claims refresh them every claim_ttl / 3 (one script call).
            assert trips.sends - before <= 1
            await case.release(blocker, blocked)
            await asyncio.wait_for(waiter, 5)
    finally:
        await client.aclose()


async def test_bad_input_is_refused_at_the_call(case: Case, locks: aiolock.LockManager) -> None:
    handle = case.make(locks, "input")
    with pytest.raises(ValueError, match="timeout"):
        await case.acquire(handle, -1)
    with pytest.raises(TypeError, match="timeout"):
        await case.acquire(handle, "soon")  # type: ignore[arg-type]
    assert locks.statistics().held == 0


async def test_statistics_count_per_kind(
    case: Case, locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    handle = case.make(locks, "counted")
    got = await case.acquire(handle, 0)
    held = locks.statistics().held_by_kind
    assert sum(held.values()) == locks.statistics().held >= 1
    assert not await probe_free(case, other, "counted")
    await case.release(handle, got)
    stats, seen = locks.statistics(), other.statistics()
    assert set(stats.acquired) == set(held)  # the same kind names
    assert sum(stats.acquired.values()) == sum(held.values())
    assert stats.held_by_kind == {}
    assert sum(seen.timeouts.values()) == 1  # the probe's one attempt


async def test_a_single_attempt_on_a_busy_name_is_one_round_trip(
    case: Case, redis_url: str, prefix: str, other: aiolock.LockManager
) -> None:
    """``timeout=0`` makes one attempt: no claim registered, none to withdraw."""
    blocker = case.probe(other, "once")
    blocked = await case.acquire(blocker, 0)
    client, trips = counting_client(redis_url)
    try:
        async with aiolock.LockManager(client, prefix=prefix) as manager:
            handle = case.make(manager, "once")
            with pytest.raises(aiolock.LockTimeoutError):
                await case.acquire(handle, 0)  # loads the scripts
            before = trips.sends
            with pytest.raises(aiolock.LockTimeoutError):
                await case.acquire(handle, 0)
            # A multi-lock takes its first name, fails on the second, gives the first back.
            assert trips.sends - before == (3 if case.id == "multi_lock" else 1)
            assert manager.statistics().claims == 0
    finally:
        await client.aclose()
    await case.release(blocker, blocked)
