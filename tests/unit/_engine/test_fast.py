"""Unit tests of :mod:`aiolock._engine.fast`.

Checks which acquisitions and releases the fast path takes, by its counters
(``fast_acquired``, ``fast_released``) against the engine's count of new holds: an
uncontended cycle takes it and leaves no queue; a single attempt on a busy lock times out
without queueing; a busy lock with a timeout goes on in the engine's wait; a task that
asks while a fast attempt is in flight queues behind it; re-entries, nested releases,
observers and kinds with claims take the engine's path; an attempt cancelled in flight
is undone; and a release of a hold Redis lost reports it once.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.engine import Engine
from aiolock._engine.kind import Attempt, Busy, Granted


def engine_of(locks: aiolock.LockManager) -> Engine:
    engine = locks._engine
    assert engine is not None
    return engine


def counts(locks: aiolock.LockManager) -> tuple[int, int, int]:
    """(fast acquisitions, fast releases, new holds of the 'lock' kind)."""
    engine = engine_of(locks)
    return engine.fast_acquired, engine.fast_released, engine.acquired["lock"]


def queues(locks: aiolock.LockManager) -> tuple[int, int]:
    hub = locks.statistics().hub
    return hub.queues, hub.waiters


async def test_an_uncontended_cycle_takes_the_fast_path_and_leaves_no_queue(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("free")
    await lock.acquire(timeout=5)
    assert counts(locks) == (1, 0, 1)
    assert await lock.owned() and lock.fencing_token is not None
    assert queues(locks) == (0, 0)  # its place in the queue was only an entry, dropped
    await lock.release()
    assert counts(locks) == (1, 1, 1)
    assert not await lock.locked()
    assert await lock.try_acquire()  # a single attempt takes it too
    await lock.release()
    assert counts(locks) == (2, 2, 2)
    assert locks.statistics().held == 0


async def test_one_attempt_at_a_busy_lock_times_out_without_queueing(
    locks: aiolock.LockManager, redis: Redis, prefix: str
) -> None:
    async with aiolock.LockManager(redis, prefix=prefix) as other:
        held = other.lock("busy")
        await held.acquire()
        assert not await locks.lock("busy").try_acquire()
        with pytest.raises(aiolock.LockTimeoutError, match="held by another owner"):
            await locks.lock("busy").acquire(timeout=0)
        assert counts(locks) == (0, 0, 0)
        assert locks.statistics().timeouts == {"lock": 2}
        assert queues(locks) == (0, 0)
        assert await held.owned()
        await held.release()


async def test_a_busy_lock_goes_on_in_the_engines_wait(
    locks: aiolock.LockManager, redis: Redis, prefix: str
) -> None:
    async with aiolock.LockManager(redis, prefix=prefix) as other:
        await other.lock("expiring", lease=0.2).acquire()  # never released: it expires
        lock = locks.lock("expiring")
        with anyio.fail_after(5):
            await lock.acquire(timeout=5)  # Busy at first; the wait takes it later
        assert counts(locks) == (0, 0, 1)
        assert await lock.owned()
        assert queues(locks) == (0, 0)  # the wait left the queue
        await lock.release()
        assert not await lock.locked()


async def test_a_task_asking_during_a_fast_attempt_queues_behind_it(
    locks: aiolock.LockManager,
) -> None:
    order: list[str] = []
    first_in, first_out = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with locks.lock("line"):  # the fast attempt...
            order.append("first in")
            first_in.set()
            await first_out.wait()
            order.append("first out")

    async def second() -> None:
        async with locks.lock("line"):  # ...is in flight: this one queues behind it
            order.append("second in")

    tasks = [asyncio.create_task(first()), asyncio.create_task(second())]
    with anyio.fail_after(5):
        await first_in.wait()
        assert queues(locks) == (1, 1)  # the second waits in the queue made for it
        first_out.set()
        await asyncio.gather(*tasks)
    assert order == ["first in", "first out", "second in"]
    # The first acquired fast; its release handed the lock over (the engine's); the
    # second's release, with nobody waiting, was fast again.
    assert counts(locks) == (1, 1, 2)
    assert queues(locks) == (0, 0)


async def test_reentries_nested_releases_observers_and_claims_take_the_engine(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("nested")
    async with lock:
        async with lock:
            assert await lock.hold_count() == 2
        assert counts(locks) == (1, 0, 1)  # the re-entry and its release: the engine's
    assert counts(locks) == (1, 1, 1)  # the final release: fast
    engine = engine_of(locks)
    async with locks.fair_lock("fair"):  # a kind with claims: the engine's acquire...
        assert (engine.fast_acquired, engine.acquired["fair lock"]) == (1, 1)
    assert engine.fast_released == 2  # ...but nothing to hand over: a fast release
    observer = aiolock.Observer()
    locks.add_observer(observer)
    async with lock:
        pass
    locks.remove_observer(observer)
    assert counts(locks) == (1, 2, 2)  # observed: neither was fast
    async with lock:  # no observer any more: fast again
        pass
    assert counts(locks) == (2, 3, 3)


async def test_a_manager_that_stopped_acquiring_refuses_even_one_attempt(
    locks: aiolock.LockManager,
) -> None:
    locks.stop_acquiring()
    with pytest.raises(aiolock.ManagerNotOpenError, match="hands out no more locks"):
        await locks.lock("closed").try_acquire()
    assert counts(locks) == (0, 0, 0)
    assert not await locks.lock("closed").locked()


@pytest.mark.parametrize("timeout", [0, 5])
async def test_an_attempt_cancelled_in_flight_is_undone(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch, timeout: float
) -> None:
    """The script ran and granted the lock, but its reply never reached the task."""
    lock = locks.lock("cancelled")
    kind = lock._kind
    granted = asyncio.Event()
    real_attempt = kind.attempt

    async def attempt(attempt: Attempt) -> Granted | Busy:
        outcome = await real_attempt(attempt)  # granted in Redis...
        granted.set()
        await asyncio.Event().wait()  # ...and the reply held up until the cancel comes
        return outcome

    monkeypatch.setattr(kind, "attempt", attempt)
    task = asyncio.create_task(lock.acquire(timeout=timeout))
    with anyio.fail_after(5):
        await granted.wait()
    assert await lock.locked()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await lock.locked()  # undone before the cancellation came out
    assert counts(locks) == (0, 0, 0)
    assert locks.statistics().held == 0 and queues(locks) == (0, 0)


async def test_a_fast_release_of_a_hold_redis_lost_reports_it_once(
    locks: aiolock.LockManager, admin: Redis
) -> None:
    lock = locks.lock("vanished")
    await lock.acquire()
    await admin.delete(lock.key)  # gone behind the manager's back
    with pytest.raises(aiolock.LockLostError, match="no longer held by this task"):
        await lock.release()
    assert counts(locks) == (1, 1, 1)
    assert locks.statistics().lost == {"lock": 1}
    assert locks.statistics().held == 0
    with pytest.raises(aiolock.LockNotOwnedError) as again:
        await lock.release()
    assert not isinstance(again.value, aiolock.LockLostError)  # reported once only
