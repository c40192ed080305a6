"""What a waiting task keeps alive (issue 24): at 50,000 waiters CPython's cyclic GC walks
every object a waiter holds, and a release of N locks puts N attempts in flight at once,
each walked by the collections that run meanwhile. These counts are exact, not timings."""

from __future__ import annotations

import asyncio
from types import CodeType

import aiolock
from aiolock._engine.acquire import AcquirePath
from aiolock._engine.waiter import ChannelQueue, Waiter
from aiolock._kinds.fair.kind import FairLockKind
from aiolock._kinds.lock.kind import ReentrantLockKind
from aiolock._redis.pipeline import Pipelining
from tests._support.helpers import eventually


def _code(function: object) -> CodeType:
    code = getattr(function, "__code__", None)
    assert isinstance(code, CodeType), function
    return code


def test_the_coroutines_of_a_wait_and_an_attempt_have_no_cells() -> None:
    """A name that a nested function captures gets a cell when its frame starts, kept
    for the frame's life: for the frames of a waiting task and of an attempt in flight,
    one more object per waiter (or attempt) for the GC. None of them captures one."""
    hot = [
        AcquirePath.wait,
        AcquirePath.attempt,
        Waiter.wait,
        Pipelining._execute,
        Pipelining._send,
        ReentrantLockKind.attempt,
        ReentrantLockKind.release,
        FairLockKind.attempt,
        FairLockKind.release,
    ]
    for function in hot:
        code = _code(function)
        assert code.co_cellvars == (), (function, code.co_cellvars)


def test_a_waiter_keeps_one_state_not_a_flag_per_state() -> None:
    """At 50,000 waiters the Waiter objects are most of the client's memory: eleven slots
    (one WaiterState where three flags were: 120 B each on CPython 3.11, from 136)."""
    assert len(Waiter.__slots__) <= 11
    waiter = Waiter(ChannelQueue("c"), "owner:1", None)
    assert not hasattr(waiter, "__dict__")


def test_a_queue_keeps_its_waiters_in_a_list() -> None:
    """A deque with its first block is about 600 B; most queues hold one waiter."""
    assert type(ChannelQueue("c").waiters) is list


async def test_a_waiting_handle_carries_no_body_guard(redis_url: str, prefix: str) -> None:
    """The guard (and its blocks) is made when a block enters, not while the task waits."""
    from redis.asyncio import Redis

    async with (
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix) as holder_side,
        aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix) as locks,
    ):
        held = holder_side.lock("guarded")
        await held.acquire()
        waiting = locks.lock("guarded", timeout=30)
        entered = asyncio.Event()

        async def waiter() -> None:
            async with waiting:
                entered.set()

        task = asyncio.create_task(waiter())
        try:
            await eventually(
                lambda: locks.statistics().hub.subscriptions == 1, what="the waiter subscribed"
            )
            assert waiting._body_guard is None
        finally:
            await held.release()
        await asyncio.wait_for(entered.wait(), 30)
        await asyncio.wait_for(task, 30)
        assert waiting._body_guard is not None
        await holder_side.redis.aclose()
        await locks.redis.aclose()
