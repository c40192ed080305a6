"""``max_hold``: a bound on holding (issue 37, item 3; docs/semantics.md, "A bound on
holding").

Renewal goes on until a hold has lasted ``max_hold``; then the hold ends as any loss
does: its ``async with`` body is cancelled, :class:`~aiolock.LockLostError` is raised
(by the block, or by the owner's next release), and the lock is released in Redis, so
another client gets it well before the lease would have run out. Every kind that renews
takes it (per handle, and as the manager's default); a Redlock too.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock.testing import RedisServer
from tests._support.helpers import PATIENCE, eventually
from tests._support.redlock import redlock, started

#: the bound in these tests, and the lease that would otherwise keep renewing
MAX_HOLD = 0.5
LEASE = 30.0

#: kind -> (what to hold, given a manager and a name; what another client takes after it)
Maker = Callable[[aiolock.LockManager, str, Any], Any]
KINDS: dict[str, Maker] = {
    "lock": lambda m, name, kw: m.lock(name, **kw),
    "fair": lambda m, name, kw: m.fair_lock(name, **kw),
    "read": lambda m, name, kw: m.rw_lock(name, **kw).read(),
    "write": lambda m, name, kw: m.rw_lock(name, **kw).write(),
    "semaphore": lambda m, name, kw: m.semaphore(name, 1, **kw),
    "multi": lambda m, name, kw: m.multi_lock([f"{name}:a", f"{name}:b"], **kw),
    "token": lambda m, name, kw: m.lock(name, wire="token", **kw),
}
#: what excludes the held thing, for the other client (a read side shares with reads)
RIVALS: dict[str, Maker] = {**KINDS, "read": KINDS["write"]}


async def _ends_in_time(body: Awaitable[Any]) -> BaseException:
    """Run *body* (an ``async with`` that sleeps far past MAX_HOLD); return how it ended."""
    try:
        await asyncio.wait_for(body, PATIENCE)
    except BaseException as exc:
        return exc
    raise AssertionError("the body ran to its end: max_hold did not end the hold")


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_body_held_past_max_hold_is_cancelled_and_the_lock_released(
    redis_url: str, prefix: str, kind: str
) -> None:
    async with (
        aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=LEASE) as locks,
        aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=LEASE) as others,
    ):
        handle = KINDS[kind](locks, "bounded", {"max_hold": MAX_HOLD})
        started_at = time.monotonic()
        steps: list[float] = []

        async def body() -> None:
            async with handle:
                while True:  # a hung body: it would hold the lock forever
                    steps.append(time.monotonic())
                    await asyncio.sleep(0.05)

        ended = await _ends_in_time(body())
        held_for = time.monotonic() - started_at
        assert isinstance(ended, aiolock.LockLostError), repr(ended)
        assert "max_hold=0.5" in str(ended)
        assert MAX_HOLD <= held_for < MAX_HOLD + 2.0
        # The bound runs from the grant (the first step), not from the call: on a loaded
        # machine the acquisition alone took 0.38 s. The margin covers the loop's lag only:
        # a body let run would have stepped until PATIENCE.
        assert steps and steps[-1] - steps[0] < MAX_HOLD + 0.25  # no step after the end
        # Released in Redis: another client takes it now, not after the 30 s lease.
        rival = RIVALS[kind](others, "bounded", {})

        async def take() -> None:
            async with rival:
                pass

        await asyncio.wait_for(take(), PATIENCE)  # (PATIENCE is well under the lease)
        assert sum(locks.statistics().lost.values()) >= 1


async def test_the_managers_max_hold_applies_unless_a_handle_says_otherwise(
    redis_url: str, prefix: str
) -> None:
    async with aiolock.LockManager.from_url(
        redis_url, prefix=prefix, lease=LEASE, max_hold=MAX_HOLD
    ) as locks:
        assert locks.max_hold == MAX_HOLD
        bounded = locks.lock("default")
        await bounded.acquire()
        await asyncio.sleep(MAX_HOLD + 0.5)
        with pytest.raises(aiolock.LockLostError, match="max_hold"):
            await bounded.release()  # the owner learns of it at its next release
        await eventually(lambda: _free(bounded), what="the release in Redis")
        free = locks.lock("unbounded", max_hold=None)  # this handle: no bound
        async with free:
            await asyncio.sleep(MAX_HOLD + 0.3)
            assert await free.owned()
        longer = locks.lock("longer", max_hold=MAX_HOLD * 4)
        async with longer:
            await asyncio.sleep(MAX_HOLD + 0.3)
            assert await longer.owned()


async def _free(lock: aiolock.Lock) -> bool:
    return not await lock.locked()


async def test_a_leaders_term_is_not_bounded_by_the_managers_max_hold(
    redis_url: str, prefix: str
) -> None:
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, max_hold=MAX_HOLD) as locks:
        election = locks.leader("scheduler")
        async with election.lead():
            await asyncio.sleep(MAX_HOLD + 0.3)
            assert election.is_leader


async def test_a_reentry_keeps_the_first_acquisitions_deadline(locks: aiolock.LockManager) -> None:
    lock = locks.lock("reentered", max_hold=1.0)
    granted_at = math.inf
    with pytest.raises(aiolock.LockLostError):
        async with lock:
            granted_at = time.monotonic()
            await asyncio.sleep(0.6)
            async with lock:  # re-entered late: its own 1 s would end at 1.6 s
                await asyncio.sleep(PATIENCE)
    assert time.monotonic() - granted_at < 1.5


async def test_a_hold_released_in_time_is_not_touched(locks: aiolock.LockManager) -> None:
    lock = locks.lock("quick", max_hold=MAX_HOLD)
    for _ in range(3):
        async with lock:
            await asyncio.sleep(0.01)
    await asyncio.sleep(MAX_HOLD + 0.2)  # the timers of the released holds are gone
    assert sum(locks.statistics().lost.values()) == 0
    async with lock:  # and a new hold gets a bound of its own
        assert await lock.owned()


async def test_an_adopted_hold_is_bounded_from_its_adoption(locks: aiolock.LockManager) -> None:
    lock = locks.lock("handed", max_hold=MAX_HOLD)
    await lock.acquire()
    token = await lock.detach()

    async def adopter() -> None:
        async with lock.adopted(token):
            await asyncio.sleep(PATIENCE)

    adopted_at = time.monotonic()
    ended = await _ends_in_time(adopter())
    assert isinstance(ended, aiolock.LockLostError), repr(ended)
    assert MAX_HOLD <= time.monotonic() - adopted_at < MAX_HOLD + 2.0


@pytest.mark.parametrize("value", [0, -1, float("nan"), "1", True])
def test_a_bad_max_hold_is_refused_at_the_call(locks: aiolock.LockManager, value: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="max_hold"):
        locks.lock("x", max_hold=value)
    with pytest.raises((TypeError, ValueError), match="max_hold"):
        locks.semaphore("x", 2, max_hold=value)
    with pytest.raises((TypeError, ValueError), match="max_hold"):
        aiolock.LockManager(Redis(), max_hold=value)


# -- Redlock ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def masters() -> Iterator[list[RedisServer]]:
    with started(3) as servers:
        yield servers


@pytest.fixture
async def redlocks(masters: list[RedisServer]) -> AsyncIterator[aiolock.RedlockManager]:
    async with redlock(masters, f"mh-{uuid.uuid4().hex[:8]}", lease=LEASE) as manager:
        yield manager


async def test_a_redlock_body_held_past_max_hold_is_cancelled_and_released(
    masters: list[RedisServer], redlocks: aiolock.RedlockManager
) -> None:
    lock = redlocks.lock("bounded", max_hold=MAX_HOLD)
    started_at = time.monotonic()

    async def body() -> None:
        async with lock:
            await asyncio.sleep(PATIENCE)

    ended = await _ends_in_time(body())
    assert isinstance(ended, aiolock.LockLostError), repr(ended)
    assert "max_hold=0.5" in str(ended)
    assert time.monotonic() - started_at < MAX_HOLD + 2.0
    async with redlock(masters, redlocks.prefix, lease=LEASE) as other:
        assert await other.lock("bounded").try_acquire(timeout=PATIENCE)
        await other.lock("bounded").release()


async def test_a_redlock_managers_max_hold_is_its_handles_default(
    masters: list[RedisServer],
) -> None:
    async with redlock(masters, f"mh-{uuid.uuid4().hex[:8]}", max_hold=MAX_HOLD) as locks:
        lock = locks.lock("default")
        await lock.acquire()
        await asyncio.sleep(MAX_HOLD + 0.5)
        with pytest.raises(aiolock.LockLostError, match="max_hold"):
            await lock.release()
        async with locks.lock("unbounded", max_hold=None) as free:
            await asyncio.sleep(MAX_HOLD + 0.3)
            assert await free.owned()
