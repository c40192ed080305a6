"""A lock held across ``yield``: an async generator's ``async with`` block is closed,
finalised or lost wherever that happens (issue 23, item 2).

The FastAPI streaming case, under a real uvicorn, is in tests/unit/contrib/test_fastapi.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import time
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

import aiolock
from aiolock.testing import RedisServer
from tests._support.helpers import lock_held

#: Long enough that an expiry can never be what frees a lock in these tests.
LEASE = 30.0


def loop_errors() -> list[dict[str, Any]]:
    """Collect what asyncio reports to the loop's exception handler (an error while
    finalising an async generator, a task exception never retrieved)."""
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: errors.append(context))
    return errors


def cancelling() -> int:
    """The current task's count of pending cancellation requests (Python >= 3.11)."""
    current = asyncio.current_task()
    assert current is not None
    if sys.version_info >= (3, 11):
        return current.cancelling()
    return 0


async def gone(redis: Redis, key: str, within: float = 10.0) -> float:
    """Seconds until *key* is gone from Redis (fails after *within*)."""
    started = time.monotonic()
    while await lock_held(redis, key):
        assert time.monotonic() - started < within, f"{key} still held after {within} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def rows(lock: aiolock.Lock) -> AsyncGenerator[int, None]:
    async with lock:
        for number in range(1000):
            yield number


async def test_a_generator_the_consumer_breaks_out_of_releases_when_finalised(
    redis: Redis, prefix: str
) -> None:
    """The consumer breaks; asyncio finalises the generator in a task of its own. The
    lock is freed then, while the consumer task is still alive (it used to stay held and
    renewed for that task's whole life, with 'exited in a task that did not enter it')."""
    errors = loop_errors()
    async with aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as locks:
        lock = locks.lock("rows")
        async for _ in rows(lock):
            break
        gc.collect()
        assert await gone(redis, lock.key) < 5.0
        assert locks.statistics().held == 0
        assert locks.statistics().released_on_task_exit == 0
        # the consumer task goes on, uncancelled, and can take the lock again
        async with lock:
            assert await lock.owned()
    assert errors == []


async def test_a_generator_closed_from_another_task_releases_its_lock(
    redis: Redis, prefix: str
) -> None:
    errors = loop_errors()
    async with aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as locks:
        lock = locks.lock("rows")
        generator = rows(lock)
        assert await generator.__anext__() == 0  # entered by this task
        assert await lock.locked()
        await asyncio.create_task(generator.aclose())  # closed by another
        assert not await lock.locked()
        assert locks.statistics().held == 0
        async with lock:
            assert await lock.owned()
    assert errors == []


async def test_a_task_that_abandons_an_open_block_names_the_cause(
    redis: Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The task ends with the generator suspended at its yield (kept alive, so never
    finalised): the task-exit safety net frees the lock, and its warning names the open
    block rather than 'a helper that runs the acquire in a task of its own'."""
    async with aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as locks:
        lock = locks.lock("rows")
        kept = rows(lock)

        async def consume() -> None:
            await kept.__anext__()

        with caplog.at_level(logging.WARNING, logger="aiolock"):
            await asyncio.create_task(consume())
            await gone(redis, lock.key)
        warned = " ".join(r.getMessage() for r in caplog.records)
        assert "held across a 'yield'" in warned
        assert "task of its own" not in warned
        await kept.aclose()  # the late close finds it released: no error, no second release
        assert locks.statistics().held == 0


async def test_a_lock_lost_inside_a_generator_raises_in_the_consumer_task(
    redis: Redis, prefix: str
) -> None:
    """The body is cancelled natively: no cancel scope is left on the consumer's task,
    whose code after the generator runs normally."""
    async with aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as locks:
        lock = locks.lock("rows", lease=0.3)  # a fixed lease: lost at its deadline

        async def slow() -> AsyncGenerator[int, None]:
            async with lock:
                yield 1
                await asyncio.sleep(10)
                yield 2

        seen: list[int] = []
        started = time.monotonic()
        with pytest.raises(aiolock.LockLostError, match="lost inside 'async with'"):
            async with aclosing(slow()) as generator:
                async for number in generator:
                    seen.append(number)
        assert seen == [1]
        assert time.monotonic() - started < 5
        await asyncio.sleep(0.05)  # no stray cancellation is left for this task
        assert cancelling() == 0


async def test_a_loss_is_not_swallowed_by_an_anyio_scope_inside_the_body(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("scoped", lease=0.3)
    with pytest.raises(aiolock.LockLostError):
        async with lock:
            with anyio.move_on_after(10):
                async with anyio.create_task_group() as group:
                    group.start_soon(anyio.sleep, 10)
                    await anyio.sleep(10)
            pytest.fail("the body went on after its lock was lost")


async def test_a_body_that_catches_the_cancellation_still_reports_the_loss(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("stubborn", lease=0.3)
    with pytest.raises(aiolock.LockLostError):
        async with lock:
            # A body that should not swallow it; the loss is still reported.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)
    await asyncio.sleep(0.05)  # and nothing is left pending for the task
    assert cancelling() == 0


async def test_a_cancellation_from_outside_goes_on_after_a_loss(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("both", lease=0.3)
    entered = asyncio.Event()

    async def body() -> None:
        async with lock:
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await lock.locked()


async def test_one_handle_in_generators_of_two_tasks_each_closed_elsewhere(
    redis: Redis, prefix: str
) -> None:
    """A shared handle entered by two tasks' generators: each block is found by the frame
    that entered it, so closing one (from a third task) releases that one's permit only."""
    errors = loop_errors()
    async with aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as locks:
        slots = locks.semaphore("slots", 2)

        async def permits(tag: str) -> AsyncGenerator[str, None]:
            async with slots:
                yield tag
                yield tag

        first, second = permits("a"), permits("b")
        entered = asyncio.Event()
        keep = asyncio.Event()

        async def consume(generator: AsyncGenerator[str, None]) -> None:
            await generator.__anext__()
            if generator is second:
                entered.set()
            await keep.wait()  # alive, its generator suspended inside the block

        tasks = [asyncio.create_task(consume(g)) for g in (first, second)]
        await entered.wait()
        await until_holders(slots, 2)
        await asyncio.create_task(first.aclose())  # closed by a third task
        assert await slots.holders() == 1
        assert await second.__anext__() == "b"  # the other block is untouched, and goes on
        await second.aclose()
        assert await slots.holders() == 0
        keep.set()
        await asyncio.gather(*tasks)
        assert locks.statistics().released_on_task_exit == 0
    assert errors == []


async def until_holders(slots: aiolock.Semaphore, count: int) -> None:
    started = time.monotonic()
    while await slots.holders() != count:
        assert time.monotonic() - started < 5
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def masters() -> Iterator[list[RedisServer]]:
    started: list[RedisServer] = []
    try:
        for _ in range(3):
            started.append(RedisServer().start())
        yield started
    finally:
        for server in started:
            server.stop()


async def test_a_redlock_held_in_a_generator_is_released_when_finalised(
    masters: list[RedisServer], prefix: str
) -> None:
    errors = loop_errors()
    clients = [Redis.from_url(server.url) for server in masters]
    try:
        async with aiolock.LockManager.redlock(
            clients, prefix=prefix, node_timeout=0.1, lease=LEASE
        ) as red:
            lock = red.lock("rows")

            async def rows() -> AsyncGenerator[int, None]:
                async with lock:
                    for number in range(10):
                        yield number

            async for _ in rows():
                break
            gc.collect()

            async def other() -> bool:
                async with red.lock("rows", timeout=20):
                    return True

            started = time.monotonic()
            assert await asyncio.create_task(other())
            # released when the generator was finalised (room for a loaded machine), not
            # when the consumer task (this test's) ends, which it does not before this
            took = time.monotonic() - started
            assert took < 5.0, f"another task got the lock after {took:.2f} s"
    finally:
        for client in clients:
            await client.aclose()
    assert errors == []
