"""Unit tests of :mod:`aiolock._engine.cleanup`.

Checks ``finish_despite_cancel`` (the work always completes; a native cancellation of
the caller waits for it and is re-raised, an anyio one takes effect after it),
``send_or`` (the fallback on a Redis error or a send that takes too long, nothing else),
and :class:`Cleanup`: ``run_once`` retries failed jobs until their lease has surely
ended, ``drain`` waits for the sends in progress and tries the queued jobs once more,
and ``run`` retries in the background until a job succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel
import pytest

from aiolock._engine import cleanup as cleanup_module
from aiolock._engine.cleanup import Cleanup, finish_despite_cancel, send_or
from aiolock._errors import LockConnectionError


def failing(times: int, done: asyncio.Event | None = None) -> Callable[[], Awaitable[object]]:
    """An action that fails *times* times with a connection error, then succeeds."""
    calls = 0

    async def action() -> None:
        nonlocal calls
        calls += 1
        await anyio.lowlevel.checkpoint()
        if calls <= times:
            raise LockConnectionError(f"attempt {calls}: Redis cannot be reached")
        if done is not None:
            done.set()

    return action


async def test_finish_despite_cancel_returns_what_the_work_returns_or_raises() -> None:
    async def answer() -> int:
        await anyio.lowlevel.checkpoint()
        return 42

    async def broken() -> int:
        await anyio.lowlevel.checkpoint()
        raise ValueError("the work failed")

    assert await finish_despite_cancel(answer) == 42
    with pytest.raises(ValueError, match="the work failed"):
        await finish_despite_cancel(broken)


async def test_a_cancelled_caller_waits_for_the_work_then_unwinds() -> None:
    started, gate = asyncio.Event(), asyncio.Event()
    finished: list[str] = []
    seen_at_cancel: list[list[str]] = []

    async def work() -> str:
        started.set()
        await gate.wait()
        finished.append("work")
        return "done"

    async def caller() -> str:
        try:
            return await finish_despite_cancel(work)
        except asyncio.CancelledError:
            seen_at_cancel.append(list(finished))
            raise

    task = asyncio.create_task(caller())
    await started.wait()
    task.cancel()  # arrives while the work is still waiting at its gate
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen_at_cancel == [["work"]]  # the cancellation came out after the work ended


async def test_an_anyio_cancellation_takes_effect_after_the_work() -> None:
    finished: list[str] = []
    reached = False

    async def work() -> None:
        await anyio.lowlevel.checkpoint()
        finished.append("work")

    with anyio.CancelScope() as scope:
        scope.cancel()
        await finish_despite_cancel(work)
        reached = True  # not reached: the cancellation is delivered after the work
    assert finished == ["work"]
    assert scope.cancelled_caught and not reached


async def test_send_or_falls_back_on_redis_errors_and_on_slow_sends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fallbacks: list[str] = []

    def otherwise() -> None:
        fallbacks.append("retry later")

    await send_or(failing(0), otherwise)
    assert fallbacks == []
    await send_or(failing(1), otherwise)  # a LockError: Redis could not be reached
    assert fallbacks == ["retry later"]

    async def bug() -> None:
        raise KeyError("not a Redis problem")

    with pytest.raises(KeyError):
        await send_or(bug, otherwise)
    assert fallbacks == ["retry later"]

    monkeypatch.setattr(cleanup_module, "SHIELD_TIMEOUT", 0.05)
    never = asyncio.Event()
    await send_or(never.wait, otherwise)  # no answer within the bound
    assert fallbacks == ["retry later", "retry later"]


async def test_run_once_retries_failed_jobs_until_their_lease_has_ended(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cleanup = Cleanup()
    later = time.monotonic() + 60
    cleanup.add("flaky release", failing(1), later)
    cleanup.add("hopeless release", failing(100), time.monotonic() - 1)  # lease over
    cleanup.add("good release", failing(0), later)
    assert cleanup.pending == 3
    caplog.set_level(logging.WARNING, logger="aiolock")
    assert await cleanup.run_once() == 1  # the flaky one stays
    assert (cleanup.done, cleanup.abandoned, cleanup.pending) == (1, 1, 1)
    assert "gave up on hopeless release (it no longer matters)" in caplog.text
    assert await cleanup.run_once() == 0
    assert (cleanup.done, cleanup.abandoned, cleanup.pending) == (2, 1, 0)
    assert await cleanup.run_once() == 0  # nothing left to do


async def test_a_job_that_fails_unexpectedly_is_given_up_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A job raising something other than a Redis error used to end the round (the jobs
    after it dropped), leave the count of jobs being tried too high (``drain`` waited
    for it until ``close_timeout``) and end the retry loop, failing the manager."""
    cleanup = Cleanup()
    later = time.monotonic() + 60

    async def broken() -> None:
        raise RuntimeError("a defect in the job")

    cleanup.add("broken release", broken, later)
    cleanup.add("good release", failing(0), later)
    caplog.set_level(logging.ERROR, logger="aiolock")
    assert await cleanup.run_once() == 0
    assert (cleanup.done, cleanup.abandoned, cleanup.pending) == (1, 1, 0)
    assert "gave up on broken release after an unexpected error" in caplog.text
    with anyio.fail_after(5):
        await cleanup.drain()  # nothing counted as still being tried


async def test_a_cancelled_round_keeps_the_untried_jobs_queued() -> None:
    cleanup = Cleanup()
    later = time.monotonic() + 60
    trying, never = asyncio.Event(), asyncio.Event()

    async def stuck() -> None:
        trying.set()
        await never.wait()

    cleanup.add("stuck release", stuck, later)
    cleanup.add("next release", failing(0), later)
    round_ = asyncio.create_task(cleanup.run_once())
    await trying.wait()
    round_.cancel()
    with pytest.raises(asyncio.CancelledError):
        await round_
    assert cleanup.pending == 2  # both queued again, none counted as being tried
    never.set()
    assert await cleanup.run_once() == 0
    assert (cleanup.done, cleanup.pending) == (2, 0)


async def test_drain_waits_for_the_sends_in_progress() -> None:
    cleanup = Cleanup()
    began, gate, draining = asyncio.Event(), asyncio.Event(), asyncio.Event()
    order: list[str] = []

    async def sender() -> None:
        cleanup.begin()
        began.set()
        try:
            await gate.wait()
            order.append("sent")
        finally:
            cleanup.end()

    async def closer() -> None:
        draining.set()
        await cleanup.drain()
        order.append("drained")

    sending = asyncio.create_task(sender())
    await began.wait()
    closing = asyncio.create_task(closer())
    await draining.wait()  # (it runs on into drain() until drain() waits)
    assert not closing.done()
    gate.set()
    with anyio.fail_after(5):
        await asyncio.gather(sending, closing)
    assert order == ["sent", "drained"]


async def test_drain_tries_each_queued_job_once_more() -> None:
    cleanup = Cleanup()
    later = time.monotonic() + 60
    cleanup.add("release a", failing(0), later)
    cleanup.add("release b", failing(5), later)  # Redis still away: stays queued
    with anyio.fail_after(5):
        await cleanup.drain()  # one more try each; it does not wait for Redis to return
    assert (cleanup.done, cleanup.pending) == (1, 1)


async def test_run_retries_in_the_background_until_the_job_succeeds() -> None:
    cleanup = Cleanup()
    succeeded = asyncio.Event()
    retrier = asyncio.create_task(cleanup.run())
    cleanup.add("release c", failing(2, succeeded), time.monotonic() + 60)
    with anyio.fail_after(5):  # (backoff: 50 ms, then 100 ms)
        await succeeded.wait()
    assert (cleanup.done, cleanup.abandoned, cleanup.pending) == (1, 0, 0)
    assert not retrier.done()  # it waits for the next job
    retrier.cancel()
    with pytest.raises(asyncio.CancelledError):
        await retrier
