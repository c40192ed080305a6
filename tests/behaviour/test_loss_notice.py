"""A hold that ends in Redis without its holder's doing is noticed at once (issue 36, item 5).

docs/semantics.md: a release or force-release that the holder's manager did not make
cancels the holder's body within a round trip of being heard (once the hold has been held
0.2 s; a younger one when its subscription is confirmed), and two tasks of one manager are
never both inside one exclusive lock. Before, only a force-release made by the holder's own
manager was noticed at once; otherwise the body ran on until the next renewal, a third of
a lease later, beside the new holder.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.heed import LISTEN_AFTER
from tests._support.helpers import eventually, within

#: A lease whose renewal (every third) cannot be what notices the loss in these tests.
LEASE = 30.0
#: What "at once" is held to here: a push and a round trip on loopback, with room for
#: a loaded machine, and far below the 10 s a renewal would take.
PROMPT = 2.0


class Body:
    """An ``async with`` body that records its steps until it is cancelled."""

    def __init__(self, lock: aiolock.Lock) -> None:
        self.lock = lock
        self.entered = asyncio.Event()
        self.steps: list[float] = []
        self.ended_at: float | None = None
        self.error: BaseException | None = None

    async def run(self) -> None:
        try:
            async with self.lock:
                self.entered.set()
                for _ in range(10_000):  # bounded: 10,000 x 5 ms
                    self.steps.append(time.monotonic())
                    await asyncio.sleep(0.005)
        except aiolock.LockLostError as exc:
            self.error = exc
        finally:
            self.ended_at = time.monotonic()


async def _held(body: Body, after: float) -> asyncio.Task[None]:
    task = asyncio.create_task(body.run())
    await within(body.entered.wait(), what="the holder's body")
    await asyncio.sleep(after)
    return task


async def test_a_force_release_by_another_manager_cancels_the_body_at_once(
    redis: Redis, prefix: str
) -> None:
    async with (
        aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as holders,
        aiolock.LockManager(redis, prefix=prefix) as admin,
    ):
        body = Body(holders.lock("forced"))
        task = await _held(body, LISTEN_AFTER + 0.3)
        forced_at = time.monotonic()
        assert await admin.lock("forced").force_release() is True
        await within(task, timeout=15, what="the holder's body to end")
        assert body.ended_at is not None
        took = body.ended_at - forced_at
        assert took < PROMPT, f"the body ran {took:.2f} s after the force-release"
        assert isinstance(body.error, aiolock.LockLostError), body.error
        assert holders.statistics().lost == {"lock": 1}


async def test_a_force_release_of_a_young_hold_is_noticed_when_it_is_heeded(
    redis: Redis, prefix: str
) -> None:
    """Released before the holder listened: its subscription's confirmation checks it."""
    async with (
        aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as holders,
        aiolock.LockManager(redis, prefix=prefix) as admin,
    ):
        body = Body(holders.lock("young"))
        task = await _held(body, 0)
        forced_at = time.monotonic()
        assert await admin.lock("young").force_release() is True
        await within(task, timeout=15, what="the holder's body to end")
        assert body.ended_at is not None
        took = body.ended_at - forced_at
        assert took < LISTEN_AFTER + PROMPT, f"the body ran {took:.2f} s after the force-release"
        assert isinstance(body.error, aiolock.LockLostError), body.error


async def test_two_tasks_of_one_manager_are_never_inside_one_lock(
    redis: Redis, prefix: str
) -> None:
    """Force-released by another client while a task of the holder's manager waits: the
    waiter is granted the lock; the holder's body is cancelled before the waiter's body
    runs a step (it used to run on for ~2 s beside it)."""
    async with (
        aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as locks,
        aiolock.LockManager(redis, prefix=prefix) as admin,
    ):
        holder = Body(locks.lock("shared-name"))
        task = await _held(holder, 0.05)
        waiter = Body(locks.lock("shared-name"))
        waiting = asyncio.create_task(waiter.run())
        await eventually(lambda: locks.statistics().hub.waiters == 1, what="the waiter")
        assert await admin.lock("shared-name").force_release() is True
        await within(waiter.entered.wait(), timeout=15, what="the waiter to get the lock")
        entered_at = time.monotonic()
        await within(task, timeout=15, what="the holder's body to end")
        assert isinstance(holder.error, aiolock.LockLostError), holder.error
        late = [t for t in holder.steps if t >= entered_at]
        assert not late, f"the holder ran {len(late)} steps after the waiter entered"
        assert await waiter.lock.locked() and waiter.error is None  # its hold is not the one lost
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting


async def test_a_release_the_manager_made_itself_is_not_a_loss(redis: Redis, prefix: str) -> None:
    """Heeded holds released and taken in turn by tasks of one manager: nothing is lost,
    and no subscription is left behind."""
    async with aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as locks:
        lock = locks.lock("turns")

        async def hold_a_while() -> None:
            async with lock:
                await asyncio.sleep(LISTEN_AFTER + 0.05)

        await within(asyncio.gather(*(hold_a_while() for _ in range(4))), timeout=20, what="turns")
        stats = locks.statistics()
        assert stats.lost == {}
        assert locks._open_engine().heed.listened >= 4  # each hold was listened for
        await eventually(
            lambda: locks.statistics().hub.subscriptions == 0, what="the subscriptions let go"
        )
