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
from tests._support.helpers import PATIENCE, lock_held, within

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
    """A shared handle entered by two tasks' generators: each block belongs to its
    generator, so closing one (from a third task) releases that one's permit only."""
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


# -- wrappings: an exit is matched to its entry by owner, to any depth (issue 39, item 4) --
#
# Each wrapping below gives a handle's ``async with`` through code of its own. The block's
# owner is the task, or the async generator, that runs the ``async with`` (not the frame
# that called __aenter__, which a wrapper's is): a loss cancels that block's body, and its
# exit (wherever it runs) raises LockLostError for it and releases its holds alone.


class Delegate:
    """A user's context manager whose __aenter__ and __aexit__ delegate to another's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner  # a handle, or another wrapping of one

    async def __aenter__(self) -> Any:
        return await self.inner.__aenter__()

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self.inner.__aexit__(*exc)  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def held(handle: Any) -> AsyncGenerator[Any, None]:
    """A user's ``asynccontextmanager`` around the handle's ``async with``."""
    async with handle as entered:
        yield entered


class Stacked:
    """The handle entered into a ``contextlib.AsyncExitStack``, left when the stack closes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Any:
        return await self.stack.enter_async_context(self.inner)

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self.stack.__aexit__(*exc)


def nested(wrap: Any, depth: int) -> Any:
    return lambda handle: handle if depth == 0 else wrap(nested(wrap, depth - 1)(handle))


#: name -> the wrapping of a handle (depth 6: more frames than the old search's 4)
WRAPPINGS = {
    "plain": lambda handle: handle,
    "delegate": Delegate,
    "delegate-6": nested(Delegate, 6),
    "asynccontextmanager": held,
    "asynccontextmanager-6": nested(held, 6),
    "exit-stack": Stacked,
    "exit-stack-6": nested(Stacked, 6),
}
wrappings = pytest.mark.parametrize("wrap", list(WRAPPINGS.values()), ids=list(WRAPPINGS))


async def lose(redis: Redis, prefix: str, name: str) -> None:
    async with aiolock.LockManager(redis, prefix=prefix) as other:  # another client's
        assert await other.lock(name).force_release()


@wrappings
async def test_a_loss_cancels_a_wrapped_body_and_its_exit_raises(
    redis: Redis, prefix: str, wrap: Any
) -> None:
    async with aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as locks:
        lock = locks.lock("wrapped")
        entered = asyncio.Event()
        after: list[str] = []

        async def body() -> None:
            async with wrap(lock):
                entered.set()
                await asyncio.sleep(PATIENCE)
                after.append("the body ran on")
            after.append("the code after the block ran")

        task = asyncio.create_task(body())
        await within(entered.wait(), what="the body")
        await lose(redis, prefix, "wrapped")
        with pytest.raises(aiolock.LockLostError, match="lost inside 'async with'"):
            await within(task, what="the body to be cancelled")
        assert after == []
        assert locks.statistics().held == 0
        async with lock:  # nothing of the lost block is left on the handle
            assert await lock.owned()
        await asyncio.sleep(0)
        assert cancelling() == 0  # nor on this task


@wrappings
async def test_a_wrapped_block_inside_another_of_the_same_handle_leaves_its_own(
    locks: aiolock.LockManager, wrap: Any
) -> None:
    """A semaphore's blocks hold a permit each. The inner block, wrapped, releases its own
    permit at its exit; the outer one keeps its own, and its loss (a fixed lease ends)
    still cancels the outer body. (The frame search found the outer block's frame above
    a shallow wrapper's exit, and released the outer permit there: the outer body then
    ran on unguarded.)"""
    slots = locks.semaphore("nest", 2, lease=1.5)
    after: list[str] = []
    with pytest.raises(aiolock.LockLostError, match="lost inside 'async with'"):
        async with slots as outer:
            async with wrap(slots) as inner:
                assert await slots.holders() == 2
            assert outer.held
            assert not inner.held
            assert await slots.holders() == 1
            await asyncio.sleep(PATIENCE)
            after.append("the outer body ran on after its permit was lost")
    assert after == []
    assert locks.statistics().held == 0
    await asyncio.sleep(0)
    assert cancelling() == 0


@wrappings
async def test_wrapped_blocks_in_generators_of_two_tasks_each_closed_elsewhere(
    redis: Redis, prefix: str, wrap: Any
) -> None:
    """One semaphore handle, entered through a wrapping in the generators of two tasks;
    one is closed by a third task: that generator's block is the one that ends (the frame
    search found none for a wrapped exit there, and raised RuntimeError)."""
    errors = loop_errors()
    async with aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as locks:
        slots = locks.semaphore("slots", 2)

        async def permits(tag: str) -> AsyncGenerator[aiolock.Permit, None]:
            async with wrap(slots) as permit:
                yield permit
                yield permit

        first, second = permits("a"), permits("b")
        entered = asyncio.Event()
        keep = asyncio.Event()
        got: dict[str, aiolock.Permit] = {}

        async def consume(tag: str, generator: AsyncGenerator[aiolock.Permit, None]) -> None:
            got[tag] = await generator.__anext__()
            if generator is second:
                entered.set()
            await keep.wait()  # alive, its generator suspended inside the block

        tasks = [asyncio.create_task(consume(*pair)) for pair in (("a", first), ("b", second))]
        await within(entered.wait(), what="both generators")
        await until_holders(slots, 2)
        await asyncio.create_task(first.aclose())  # closed by a third task
        assert not got["a"].held
        assert got["b"].held
        assert await slots.holders() == 1
        assert await second.__anext__() is got["b"]  # the other block goes on
        await second.aclose()
        assert await slots.holders() == 0
        keep.set()
        await asyncio.gather(*tasks)
        assert locks.statistics().released_on_task_exit == 0
    assert errors == []


async def exit_through(depth: int, handle: Any, *exc: Any) -> None:
    """``handle.__aexit__`` called *depth* coroutines below the caller (a helper's own)."""
    if depth == 0:
        await handle.__aexit__(*exc)
    else:
        await exit_through(depth - 1, handle, *exc)


@pytest.mark.parametrize("depth", [1, 6])
async def test_a_helper_that_exits_deeper_than_it_entered(
    redis: Redis, prefix: str, depth: int
) -> None:
    """Like the FastAPI dependency: a generator calls ``__aenter__`` itself, and
    ``__aexit__`` through helpers of its own; closed by another task while a second
    task's generator holds the same handle. The old search looked 4 frames up."""
    errors = loop_errors()
    async with aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as locks:
        slots = locks.semaphore("helper", 2)

        async def permits() -> AsyncGenerator[aiolock.Permit, None]:
            permit = await slots.__aenter__()
            try:
                yield permit
                yield permit
            except BaseException as exc:
                await exit_through(depth, slots, type(exc), exc, exc.__traceback__)
                raise
            await exit_through(depth, slots, None, None, None)

        first, second = permits(), permits()
        keep = asyncio.Event()
        got: list[aiolock.Permit] = []

        async def consume(generator: AsyncGenerator[aiolock.Permit, None]) -> None:
            got.append(await generator.__anext__())
            await keep.wait()  # alive, its generator suspended inside the block

        tasks = [asyncio.create_task(consume(g)) for g in (first, second)]
        await until_holders(slots, 2)
        await asyncio.create_task(first.aclose())  # closed by a third task
        assert await slots.holders() == 1
        assert not got[0].held
        assert got[1].held
        await second.aclose()
        keep.set()
        await asyncio.gather(*tasks)
        assert locks.statistics().released_on_task_exit == 0
        assert await slots.holders() == 0
    assert errors == []


@pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="open on Python 3.10 under pytest-asyncio (docs/semantics.md): the loss leaves "
    "this stack as CancelledError, with this guard and the one before it; under "
    "asyncio.run the same program raises LockLostError",
)
async def test_an_exit_stack_with_two_locks_and_a_reentry(
    locks: aiolock.LockManager, redis: Redis, prefix: str
) -> None:
    """One stack: lock a, lock b, a again. Losing a cancels the body; the stack unwinds
    (a's re-entry, then b released, then a) and a's outermost exit raises the loss."""
    a, b = locks.lock("a"), locks.lock("b")
    after: list[str] = []
    with pytest.raises(aiolock.LockLostError, match="lock 'a' was lost inside"):
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(a)
            await stack.enter_async_context(b)
            await stack.enter_async_context(a)
            assert await a.hold_count() == 2
            await lose(redis, prefix, "a")
            await asyncio.sleep(PATIENCE)
            after.append("the body ran on after its lock was lost")
    assert after == []
    assert not await b.locked()
    assert not await a.locked()
    assert locks.statistics().held == 0
    await asyncio.sleep(0)
    assert cancelling() == 0


async def test_a_nested_reentry_reports_the_loss_at_the_outer_block(
    locks: aiolock.LockManager, redis: Redis, prefix: str
) -> None:
    lock = locks.lock("nested")
    after: list[str] = []
    with pytest.raises(aiolock.LockLostError, match="lost inside 'async with'"):
        async with lock:
            async with Delegate(lock):
                async with lock:
                    assert await lock.hold_count() == 3
                    await lose(redis, prefix, "nested")
                    await asyncio.sleep(PATIENCE)
                after.append("after the innermost block")
            after.append("after the middle block")
    assert after == []
    assert locks.statistics().held == 0
    async with lock:  # every block of the task was taken off the handle
        assert await lock.hold_count() == 1


async def test_the_locked_decorator_cancels_its_function_on_a_loss(
    locks: aiolock.LockManager, redis: Redis, prefix: str
) -> None:
    entered = asyncio.Event()
    after: list[str] = []

    @locks.locked("job:{n}")
    async def job(n: int) -> None:
        entered.set()
        await asyncio.sleep(PATIENCE)
        after.append("the function ran on after its lock was lost")

    task = asyncio.ensure_future(job(1))
    await within(entered.wait(), what="the function")
    await lose(redis, prefix, "job:1")
    with pytest.raises(aiolock.LockLostError, match="lost inside 'async with'"):
        await within(task, what="the function to be cancelled")
    assert after == []
    assert locks.statistics().held == 0


async def test_one_handle_in_two_tasks_a_loss_ends_both_bodies_each_at_its_exit(
    locks: aiolock.LockManager,
) -> None:
    """One semaphore handle, two tasks in their bodies, each through a different wrapping;
    the first to enter leaves first (not the reverse of the entries across tasks). Then a
    loss of both (fixed leases end): each task's body is cancelled and raises at its own
    exit, and the task that holds nothing (this one) is not touched."""
    slots = locks.semaphore("shared", 2, lease=1.5)
    entered = [asyncio.Event(), asyncio.Event()]
    leave = asyncio.Event()

    async def user(i: int, wrap: Any) -> str:
        async with wrap(slots) as permit:
            entered[i].set()
            await leave.wait()
            assert permit.held
        async with wrap(slots):
            entered[i].set()
            await asyncio.sleep(PATIENCE)
            return "the body ran on"
        return "the code after the block ran"

    first = asyncio.create_task(user(0, Delegate))
    await within(entered[0].wait(), what="the first")
    second = asyncio.create_task(user(1, held))
    await within(entered[1].wait(), what="the second")
    for event in entered:
        event.clear()
    leave.set()
    for task in (first, second):
        with pytest.raises(aiolock.LockLostError, match="lost inside 'async with'"):
            await within(task, what="the bodies to be cancelled")
    assert locks.statistics().held == 0
    await asyncio.sleep(0.05)
    assert cancelling() == 0
