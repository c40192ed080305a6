"""Unit tests of :mod:`aiolock._engine.lifecycle`.

Checks :class:`ManagerLifecycle` on a small subclass whose steps record themselves:
the states (new, open, failed, closing, closed) and the order of the steps; opening
once (also when two tasks open at once), a failed check that leaves the manager new;
``_check_open``'s words; a crash of a background task that fails the manager; closing
shielded from an anyio cancellation; opening and closing in different tasks; and the
same lifecycle as a LockManager shows it.
"""

from __future__ import annotations

import asyncio
import logging

import anyio
import pytest
from anyio.abc import TaskGroup
from redis.asyncio import Redis

import aiolock
from aiolock._engine.lifecycle import Life, ManagerLifecycle
from aiolock._errors import LockConnectionError, ManagerNotOpenError


class Toy(ManagerLifecycle):
    """A lifecycle whose steps record themselves; one background task."""

    _WHAT = "Toy"
    _HOW_TO_OPEN = "call 'await toy.open()'"
    _OPENS_ONCE_HINT = "; make a new Toy"
    _GONE_HINT = ": make a new Toy"
    _FAILED_LOG = "the toy's background task failed"
    _TASK_NAME = "toy supervisor"

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[str] = []
        self.running = asyncio.Event()  # the background task has started
        self.crash = asyncio.Event()  # makes the background task crash
        self.draining = asyncio.Event()
        self.drain_gate: asyncio.Event | None = None  # holds the drain until set
        self.check_gate: asyncio.Event | None = None  # holds _before_open until set
        self.checking = asyncio.Event()  # a task entered _before_open
        self.check_error: Exception | None = None
        self.drain_error: Exception | None = None

    async def _before_open(self) -> None:
        self.steps.append("before_open")
        self.checking.set()
        if self.check_gate is not None:
            await self.check_gate.wait()
        if self.check_error is not None:
            raise self.check_error

    def _opening(self) -> None:
        self.steps.append("opening")

    def _start_tasks(self, tg: TaskGroup) -> None:
        self.steps.append("start_tasks")
        tg.start_soon(self._background)

    async def _background(self) -> None:
        self.running.set()
        try:
            await self.crash.wait()
        except asyncio.CancelledError:
            self.steps.append("background stopped")
            raise
        raise RuntimeError("the background task crashed")

    def _failed(self) -> None:
        self.steps.append("failed")

    async def _drain(self) -> None:
        self.steps.append("drain")
        self.draining.set()
        if self.drain_gate is not None:
            await self.drain_gate.wait()
            self.steps.append("drained")
        if self.drain_error is not None:
            raise self.drain_error

    async def _after_stop(self) -> None:
        self.steps.append("after_stop")

    async def _after_close(self) -> None:
        self.steps.append("after_close")


async def started(toy: Toy) -> None:
    """Until the background task runs (the supervisor starts it in its first step)."""
    with anyio.fail_after(5):
        await toy.running.wait()


OPEN_STEPS = ["before_open", "opening", "start_tasks"]
CLOSE_STEPS = ["drain", "background stopped", "after_stop", "after_close"]


async def test_from_new_to_closed_in_order() -> None:
    toy = Toy()
    assert toy._state == "new" and not toy.is_open
    with pytest.raises(ManagerNotOpenError) as refused:
        toy._check_open()
    assert str(refused.value) == (
        "the Toy is not open: call 'await toy.open()' before acquiring locks"
    )
    assert await toy.open() is toy
    assert toy._state == "open" and toy.is_open
    toy._check_open()  # open: no error
    await started(toy)
    assert toy._supervisor is not None
    assert toy._supervisor.get_name() == "toy supervisor"
    assert toy.steps == OPEN_STEPS
    await toy.aclose()
    assert toy._state == "closed" and not toy.is_open
    assert toy.steps == OPEN_STEPS + CLOSE_STEPS
    assert toy._supervisor.done() and not toy._supervisor.cancelled()
    assert toy._supervisor.exception() is None
    with pytest.raises(ManagerNotOpenError) as refused:
        toy._check_open()
    assert str(refused.value) == "the Toy is closed: make a new Toy"
    await toy.aclose()  # idempotent: nothing runs twice
    assert toy.steps == OPEN_STEPS + CLOSE_STEPS


async def test_a_manager_opens_once() -> None:
    async with Toy() as toy:
        await started(toy)
        with pytest.raises(
            ManagerNotOpenError, match="Toy is open; a manager can be opened once; make"
        ):
            await toy.open()
    assert toy._state == "closed"
    with pytest.raises(ManagerNotOpenError, match="this Toy is closed; a manager can be opened"):
        await toy.open()
    assert toy.steps == OPEN_STEPS + CLOSE_STEPS  # the refused opens ran no step


async def test_a_failed_check_leaves_it_new_and_openable() -> None:
    toy = Toy()
    toy.check_error = LockConnectionError("Redis is not there")
    with pytest.raises(LockConnectionError):
        await toy.open()
    assert toy._state == "new" and toy._supervisor is None
    assert toy.steps == ["before_open"]
    await toy.aclose()  # nothing to close
    assert toy.steps == ["before_open"]
    toy.check_error = None
    await toy.open()
    assert toy.is_open
    await started(toy)
    await toy.aclose()
    assert toy.steps == ["before_open", *OPEN_STEPS, *CLOSE_STEPS]


async def test_of_two_tasks_opening_at_once_one_opens() -> None:
    toy = Toy()
    toy.check_gate = asyncio.Event()
    first = asyncio.create_task(toy.open())
    second = asyncio.create_task(toy.open())
    with anyio.fail_after(5):
        while toy.steps.count("before_open") < 2:  # until both are in the check
            toy.checking.clear()
            await toy.checking.wait()
    toy.check_gate.set()
    done = await asyncio.gather(first, second, return_exceptions=True)
    refused = [outcome for outcome in done if isinstance(outcome, BaseException)]
    assert [outcome for outcome in done if outcome is toy] and len(refused) == 1
    assert isinstance(refused[0], ManagerNotOpenError)
    assert "this Toy is open; it opens once" in str(refused[0])
    assert toy.steps.count("start_tasks") == 1
    await toy.aclose()


async def test_a_crashed_background_task_fails_the_manager(
    caplog: pytest.LogCaptureFixture,
) -> None:
    toy = Toy()
    await toy.open()
    supervisor = toy._supervisor
    assert supervisor is not None
    with anyio.fail_after(5):
        await toy.running.wait()
        toy.crash.set()
        await asyncio.wait((supervisor,))
    assert toy._state == "failed" and not toy.is_open
    assert toy.steps == [*OPEN_STEPS, "failed"]
    (record,) = [r for r in caplog.records if r.getMessage() == Toy._FAILED_LOG]
    assert record.levelno == logging.ERROR and record.exc_info is not None
    with pytest.raises(ManagerNotOpenError, match="the Toy is failed: make a new Toy"):
        toy._check_open()
    error = await toy._close()  # closes, and hands the crash to the manager to report
    assert error is not None
    crashes = getattr(error, "exceptions", [error])  # (in the task group's exception group)
    assert [str(crash) for crash in crashes] == ["the background task crashed"]
    assert toy._state == "closed"
    assert toy.steps == [*OPEN_STEPS, "failed", "drain", "after_stop", "after_close"]
    assert await toy._close() is None  # once


async def test_closing_is_shielded_from_an_anyio_cancellation() -> None:
    toy = Toy()
    toy.drain_gate = asyncio.Event()
    await toy.open()
    await started(toy)

    async def close_in_a_cancelled_scope() -> None:
        with anyio.CancelScope() as scope:
            scope.cancel()  # (a shutdown deadline that has passed)
            await toy.aclose()

    closing = asyncio.create_task(close_in_a_cancelled_scope())
    with anyio.fail_after(5):
        await toy.draining.wait()
    assert toy._state == "closing" and not closing.done()
    toy.drain_gate.set()
    with anyio.fail_after(5):
        await closing
    assert toy._state == "closed"
    assert toy.steps == [*OPEN_STEPS, "drain", "drained", *CLOSE_STEPS[1:]]


async def test_closing_finishes_when_the_closing_task_is_cancelled() -> None:
    """A plain ``task.cancel()`` of the task that closes (``asyncio.wait_for``'s timeout,
    a cancelled shutdown hook) waits for the whole close, then is raised: before, it cut
    the drain short and the background task ran on in a manager that said "closed"."""
    toy = Toy()
    toy.drain_gate = asyncio.Event()
    await toy.open()
    await started(toy)
    closing = asyncio.create_task(toy.aclose())
    with anyio.fail_after(5):
        await toy.draining.wait()
    closing.cancel()
    await asyncio.sleep(0)  # the cancellation reaches the closing task
    assert not closing.done() and toy._state == "closing"
    toy.drain_gate.set()
    with anyio.fail_after(5), pytest.raises(asyncio.CancelledError):
        await closing
    assert toy._state == "closed"
    assert toy._supervisor is not None and toy._supervisor.done()
    assert toy.steps == [*OPEN_STEPS, "drain", "drained", *CLOSE_STEPS[1:]]


async def test_a_drain_that_fails_still_stops_the_background_tasks() -> None:
    toy = Toy()
    toy.drain_error = RuntimeError("the drain failed")
    await toy.open()
    await started(toy)
    with pytest.raises(RuntimeError, match="the drain failed"):
        await toy.aclose()
    assert toy._state == "closed"
    assert toy._supervisor is not None and toy._supervisor.done()
    assert toy.steps == OPEN_STEPS + CLOSE_STEPS


async def test_a_lock_manager_whose_close_is_cancelled_still_frees_its_locks(
    redis: Redis, prefix: str
) -> None:
    async with aiolock.LockManager(redis, prefix=prefix) as observer:
        manager = aiolock.LockManager(redis, prefix=prefix)
        await manager.open()
        await manager.lock("held").acquire()
        closing = asyncio.create_task(manager.aclose())
        await asyncio.sleep(0)  # closing has started
        closing.cancel()
        with anyio.fail_after(10), pytest.raises(asyncio.CancelledError):
            await closing
        assert manager._state == "closed"
        assert manager._supervisor is not None and manager._supervisor.done()
        assert not await observer.lock("held").locked()


async def test_open_and_close_in_tasks_of_their_own() -> None:
    toy = Toy()
    await asyncio.create_task(toy.open())  # a startup hook's task, ended since
    assert toy.is_open
    await started(toy)  # the background task outlives the task that opened
    assert toy._supervisor is not None and not toy._supervisor.done()
    await asyncio.create_task(toy.aclose())  # a shutdown hook's task
    assert toy._state == "closed"
    assert toy.steps == OPEN_STEPS + CLOSE_STEPS


async def test_a_lock_manager_goes_through_the_same_states(redis: Redis, prefix: str) -> None:
    manager = aiolock.LockManager(redis, prefix=prefix)
    assert manager._state == "new" and not manager.is_open
    with pytest.raises(ManagerNotOpenError, match="not open: use it as 'async with"):
        await manager.lock("x").acquire()
    async with manager:
        assert manager._state == "open" and manager.is_open
        supervisor = manager._supervisor
        assert supervisor is not None and supervisor.get_name() == "aiolock manager"
        assert await manager.lock("x").try_acquire()
    assert manager._state == "closed" and supervisor.done()
    with pytest.raises(ManagerNotOpenError, match="closed: its locks can no longer be used"):
        await manager.lock("x").acquire()
    with pytest.raises(ManagerNotOpenError, match="opened once; create a new LockManager"):
        await manager.open()


def test_a_managers_life_is_an_enum_that_reads_as_its_word() -> None:
    """Issue 39: the life is an enum (no misspelt state string can pass unnoticed), whose
    text in messages and reprs is the word it replaced."""
    assert [life.value for life in Life] == ["new", "open", "failed", "closing", "closed"]
    assert str(Life.CLOSED) == "closed" and f"is {Life.OPEN}" == "is open"
    assert f"{Life.NEW:>5}" == "  new"
    word: str = "open"
    assert word == Life.OPEN  # the tests' and the recipes' comparisons still hold
