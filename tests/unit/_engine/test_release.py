"""Unit tests of :mod:`aiolock._engine.release`.

Checks, through a LockManager, what a release does: a nested release only lowers the
count; a final release hands the lock straight to a waiting task of the same manager
(counted as a hand-over streak until the lock is freed); a release of a hold Redis no
longer has raises and reports the loss, once; a release cancelled in flight is sent
again and frees the lock; a task that ends holding a lock has it released in the
background, with a warning; and the release ids (a placeholder for a kind without
tombstones, a fresh ``<manager id>:<n>`` kept for resends otherwise).
"""

from __future__ import annotations

import asyncio
import logging

import anyio
import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.engine import Engine
from aiolock._engine.kind import Hold, Released, Successor
from aiolock._engine.release import UNNAMED_RELEASE


def engine_of(locks: aiolock.LockManager) -> Engine:
    engine = locks._engine
    assert engine is not None
    return engine


def hold_of(locks: aiolock.LockManager, lock: aiolock.Lock) -> Hold:
    """The current task's hold of *lock*."""
    hold = engine_of(locks).registry.get(lock._resource, locks._owner())
    assert hold is not None
    return hold


class Ends(aiolock.Observer):
    def __init__(self) -> None:
        self.ends: list[tuple[str, str]] = []
        self.ended = asyncio.Event()

    def released(self, kind: str, name: str, held_s: float, token: int) -> None:
        self.ends.append(("released", name))
        self.ended.set()

    def lost(self, kind: str, name: str, held_s: float, token: int, reason: str) -> None:
        self.ends.append(("lost", reason))


async def test_a_nested_release_only_lowers_the_count(locks: aiolock.LockManager) -> None:
    lock = locks.lock("nested")
    await lock.acquire()
    await lock.acquire()
    hold = hold_of(locks, lock)
    assert hold.count == 2 and await lock.hold_count() == 2
    await lock.release()
    assert hold.count == 1 and await lock.hold_count() == 1  # here and in Redis
    assert await lock.locked() and locks.statistics().held == 1
    await lock.release()
    assert hold.count == 0
    assert not await lock.locked() and locks.statistics().held == 0


async def test_a_final_release_hands_the_lock_to_a_local_waiter(
    locks: aiolock.LockManager,
) -> None:
    engine = engine_of(locks)
    channel = locks.lock("relay").key + ":released"
    first_in, first_out, second_in, second_out = (asyncio.Event() for _ in range(4))
    tokens: list[int | None] = []

    async def user(entered: asyncio.Event, leave: asyncio.Event) -> None:
        lock = locks.lock("relay", timeout=5)
        async with lock:
            tokens.append(lock.fencing_token)
            entered.set()
            await leave.wait()

    tasks = [
        asyncio.create_task(user(first_in, first_out)),
        asyncio.create_task(user(second_in, second_out)),  # queued behind the first
    ]
    with anyio.fail_after(5):
        await first_in.wait()
        assert engine.hub.streak(channel) == 0
        first_out.set()
        await second_in.wait()
        # Handed over in the release's own script: the streak counts it, and the
        # waiter holds it with a token of its own.
        assert engine.hub.streak(channel) == 1
        assert engine.acquired["lock"] == 2
        first, second = tokens
        assert first is not None and second is not None and second > first
        second_out.set()
        await asyncio.gather(*tasks)
    assert engine.hub.streak(channel) == 0  # freed: the streak ends
    assert not await locks.lock("relay").locked()


async def test_releasing_a_hold_redis_no_longer_has_reports_it_lost_once(
    locks: aiolock.LockManager, admin: Redis
) -> None:
    observer = Ends()
    locks.add_observer(observer)  # (the engine's release, not the fast path)
    lock = locks.lock("gone")
    await lock.acquire()
    await admin.delete(lock.key)
    with pytest.raises(aiolock.LockLostError, match="no longer held by this task"):
        await lock.release()
    assert observer.ends == [("lost", "Redis no longer had it when it was released")]
    assert locks.statistics().lost == {"lock": 1}
    assert locks.statistics().held == 0
    with pytest.raises(aiolock.LockNotOwnedError) as again:
        await lock.release()
    assert not isinstance(again.value, aiolock.LockLostError)  # reported by the first


async def test_a_release_cancelled_in_flight_is_sent_again_and_frees_the_lock(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = locks.lock("interrupted")
    kind = lock._kind
    real_release = kind.release
    sends: list[int] = []
    stuck = asyncio.Event()

    async def release(
        hold: Hold,
        count: int,
        release_id: str,
        successor: Successor | None,
        hand_over_freely: bool,
        listening: bool,
    ) -> Released:
        sends.append(count)
        if len(sends) == 1:  # the first send never gets to Redis
            stuck.set()
            await asyncio.Event().wait()
        return await real_release(hold, count, release_id, successor, hand_over_freely, listening)

    monkeypatch.setattr(kind, "release", release)
    acquired = asyncio.Event()

    async def owner() -> None:
        await lock.acquire()
        acquired.set()
        await lock.release()

    task = asyncio.create_task(owner())
    with anyio.fail_after(5):
        await stuck.wait()
    assert acquired.is_set() and await lock.locked()
    task.cancel()
    with anyio.fail_after(5), pytest.raises(asyncio.CancelledError):
        await task
    assert sends == [1, 1]  # sent again, shielded, before the cancellation came out
    assert not await lock.locked()
    stats = locks.statistics()
    assert (stats.held, stats.pending_cleanups, stats.lost) == (0, 0, {})


async def test_a_task_that_ends_holding_a_lock_has_it_released(
    locks: aiolock.LockManager, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aiolock")
    observer = Ends()
    locks.add_observer(observer)
    lock = locks.lock("forgotten")

    async def forgetful() -> None:
        await lock.acquire()  # and never released

    await asyncio.create_task(forgetful(), name="forgetful task")
    with anyio.fail_after(5):
        await observer.ended.wait()  # (told when the task's end is handled)
    assert observer.ends == [("released", "forgotten")]
    assert locks.statistics().released_on_task_exit == 1
    assert "lock 'forgotten' was still held by task 'forgetful task'" in caplog.text
    assert "a missing release()" in caplog.text
    with anyio.fail_after(5):
        await engine_of(locks).cleanup.drain()  # the background release is done
    assert not await lock.locked()
    assert locks.statistics().held == 0


async def test_a_release_id_is_made_once_per_final_release(
    locks: aiolock.LockManager, admin: Redis
) -> None:
    engine = engine_of(locks)
    lock = locks.lock("plain")
    async with lock:
        # The lock answers a resent release from its state: no id of its own needed.
        assert engine._release_id(hold_of(locks, lock)) == UNNAMED_RELEASE
    fair = locks.fair_lock("fair")
    await fair.acquire()
    hold = hold_of(locks, fair)
    release_id = engine._release_id(hold)  # as a first send makes it
    assert release_id.startswith(f"{locks.id}:")
    assert engine._release_id(hold) == release_id  # every resend uses it
    await fair.release()
    assert hold.release_id is None  # confirmed: forgotten
    tombstone = hold.keys.tombstone(release_id)  # Redis remembers the release a while
    assert 0 < await admin.pttl(tombstone) <= 10_000
    await fair.acquire()
    assert engine._release_id(hold_of(locks, fair)) != release_id  # a new hold: a new id
    await fair.release()
