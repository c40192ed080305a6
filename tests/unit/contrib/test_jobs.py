"""aiolock.contrib.jobs: one job per resource at a time; the others skip, raise or defer."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import socket
import typing
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock.contrib.jobs import Holder, JobBusy, claim, holder_info, holder_key, singleton


@pytest.fixture
async def other(redis_url: str, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    """A second manager (another worker) on the same prefix."""
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as manager:
        yield manager


async def test_a_held_claim_publishes_its_holder_and_withdraws_it(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis
) -> None:
    key = holder_key(locks, "report:42")
    assert key == f"{locks.prefix}:lock:{{report:42}}:job"
    assert await holder_info(other, "report:42") is None
    async with claim(locks, "report:42", job_id="job-1") as me:
        assert me.job_id == "job-1" and me.pid == os.getpid()
        assert me.host == socket.gethostname() and me.token is not None
        seen = await holder_info(other, "report:42")
        assert seen == me
        assert 0 < await admin.pttl(key) <= locks.lease * 1000
        assert "job job-1 on" in str(seen)
    assert await holder_info(other, "report:42") is None
    assert await admin.exists(key) == 0


async def test_the_loser_is_told_who_holds(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    async with claim(locks, "sync:a", job_id="winner") as me:
        with pytest.raises(JobBusy) as caught:
            async with claim(other, "sync:a", job_id="loser", defer=3):
                pytest.fail("the loser ran")
    busy = caught.value
    assert busy.name == "sync:a" and busy.holder == me and busy.defer == 3
    assert isinstance(busy, aiolock.LockTimeoutError)
    assert "held by job winner on" in str(busy) and "run it again in 3 s" in str(busy)
    again = pickle.loads(pickle.dumps(busy))  # task queues pickle job errors
    assert (again.name, again.holder, again.defer) == ("sync:a", me, 3)


async def test_a_record_without_its_lock_is_not_reported(
    locks: aiolock.LockManager, admin: Redis
) -> None:
    """A holder that died between releasing and deleting leaves a record: ignored."""
    key = holder_key(locks, "stale")
    stale = Holder("stale", "ghost", "elsewhere", 1, 0.0)
    await admin.set(key, json.dumps(stale.__dict__), px=10_000)
    assert await holder_info(locks, "stale") is None
    async with locks.lock("stale"):
        assert await holder_info(locks, "stale") == stale
        await admin.set(key, "not json", px=10_000)
        assert await holder_info(locks, "stale") is None


async def test_another_holders_record_is_not_deleted(
    locks: aiolock.LockManager, admin: Redis
) -> None:
    """After a lost lease, a new holder's record must survive the old holder's exit."""
    key = holder_key(locks, "lost")
    with pytest.raises(aiolock.LockLostError):
        # a fixed 1 s lease: long enough for the body's first write on a loaded machine
        async with claim(locks, "lost", lease=1.0):
            await admin.set(key, "someone else's", px=10_000)
            await asyncio.sleep(30)  # the fixed lease runs out: the body is cancelled
    assert await admin.get(key) == b"someone else's"
    await admin.delete(key)


async def test_a_renewed_hold_keeps_its_record_alive(redis_url: str, prefix: str) -> None:
    async with (
        # a 1.5 s lease renewed every 0.5 s: a round late by a second still keeps it
        aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=1.5) as locks,
        claim(locks, "long", job_id="slow") as me,
    ):
        await asyncio.sleep(2.0)  # more than a lease: only renewal kept it
        assert await holder_info(locks, "long") == me
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as locks:
        assert await holder_info(locks, "long") is None


async def test_the_exit_ends_a_refresh_that_swallowed_its_cancellation(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim exiting while its record's refresh is in flight returns (issue 25).

    The exit cancelled the refresher once and awaited it. On Python 3.11 redis-py sends
    a command under ``asyncio.wait_for``, which returns the command's result instead of
    raising when the cancellation arrives just as the write completes: the refresher
    went on refreshing every third of the lease, and the exit awaited it forever (the
    loop idle between refreshes). The exit comes here 0 to 3 loop steps after a refresh
    began (on Python 3.11, 1 and 2 steps hung with redis-py 8.1), then during a refresh
    whose command returns its reply whatever the cancellation (as wait_for's does).
    """
    # A 1.5 s lease (a refresh every 0.5 s): a loaded machine's stalls must not end the
    # holds this test exits from (a lost hold would fail it for another reason).
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=1.5) as locks:
        evaluate = locks.redis.eval  # the record's scripts: refresh and delete
        swallow = False
        refreshes = 0
        refreshing = asyncio.Event()

        async def refresh(*args: Any) -> Any:
            nonlocal refreshes
            refreshes += 1
            refreshing.set()
            sent = asyncio.ensure_future(evaluate(*args))
            if not swallow:
                return await sent
            try:
                return await asyncio.shield(sent)
            except asyncio.CancelledError:
                return await sent  # the reply, not the cancellation

        async def exit_during_a_refresh(name: str, steps: int) -> None:
            held = claim(locks, name, job_id="r")

            async def job() -> None:
                async with held:
                    refreshing.clear()
                    monkeypatch.setattr(locks.redis, "eval", refresh)
                    await refreshing.wait()
                    for _ in range(steps):
                        await asyncio.sleep(0)

            task = asyncio.create_task(job())
            done, _ = await asyncio.wait({task}, timeout=5.0)
            if not done:  # the old code: stop the refresher (again) to end the test
                refresher = held._refresher
                while refresher is not None and not refresher.done():
                    refresher.cancel()
                    await asyncio.wait({refresher}, timeout=0.1)
                await task
            assert done, (
                f"the exit of claim {name!r}, {steps} loop step(s) after a refresh of its "
                f"record began, did not return within 5 s ({locks.lease} s lease): it "
                f"awaited a refresher that had swallowed its cancellation ({refreshes} "
                "refreshes so far)"
            )
            task.result()
            monkeypatch.setattr(locks.redis, "eval", evaluate)
            assert await holder_info(locks, name) is None

        for steps in range(4):
            await exit_during_a_refresh(f"real-{steps}", steps)
        swallow = True
        await exit_during_a_refresh("swallowed", 0)
        # No refresher runs on after its exit: no refresh in a whole lease.
        monkeypatch.setattr(locks.redis, "eval", refresh)
        before = refreshes
        await asyncio.sleep(locks.lease)
        assert refreshes == before


async def test_singleton_skips_raises_defers_or_hands_over(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    ran: list[str] = []

    async def seen(busy: JobBusy, arguments: Mapping[str, Any]) -> str:
        return f"{arguments['customer_id']} busy: {busy.holder and busy.holder.job_id}"

    @singleton(locks, "report:{customer_id}", job_id="{request}")
    async def skipping(customer_id: int, request: str) -> str:
        ran.append(request)
        return request

    @singleton(locks, "report:{customer_id}", on_busy="raise")
    async def raising(customer_id: int) -> None:
        ran.append("raising")

    @singleton(locks, "report:{customer_id}", on_busy="defer", defer=2.5)
    async def deferring(customer_id: int) -> None:
        ran.append("deferring")

    @singleton(locks, "report:{customer_id}", on_busy=seen)
    async def handled(customer_id: int) -> None:
        ran.append("handled")

    async with claim(other, "report:7", job_id="big-one"):
        assert await skipping(7, "r1") is None
        with pytest.raises(JobBusy) as raised:
            await raising(7)
        assert raised.value.defer is None and raised.value.holder is not None
        with pytest.raises(JobBusy) as deferred:
            await deferring(7)
        assert deferred.value.defer == 2.5
        assert await handled(7) == "7 busy: big-one"
        assert await skipping(8, "r2") == "r2"  # another resource is free
    assert await skipping(7, "r3") == "r3"
    assert ran == ["r2", "r3"]


async def test_singleton_runs_one_at_a_time_among_many(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    inside = 0
    most = 0

    async def body(n: int) -> int:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        await asyncio.sleep(0.2)
        inside -= 1
        return n

    a = singleton(locks, "res")(body)
    b = singleton(other, "res")(body)
    results = await asyncio.wait_for(asyncio.gather(*(f(n) for n in range(4) for f in (a, b))), 10)
    assert most == 1
    assert sum(r is not None for r in results) == 1


async def test_a_busy_error_of_the_body_is_not_taken_for_a_busy_lock(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    @singleton(locks, "outer-{n}")
    async def job(n: int) -> None:
        async with claim(locks, "inner"):
            pass

    async with claim(other, "inner"), claim(other, "inner"):  # re-entered: one record
        with pytest.raises(JobBusy, match="'inner'"):
            await job(1)  # "skip" applies to outer-1 only


async def test_the_manager_can_come_from_the_call(locks: aiolock.LockManager) -> None:
    @singleton(lambda arguments: arguments["ctx"]["locks"], "x:{ctx[tenant]}", job_id="{ctx[id]}")
    async def job(ctx: dict[str, Any]) -> Holder | None:
        return await holder_info(ctx["locks"], f"x:{ctx['tenant']}")

    me = await job({"locks": locks, "tenant": "acme", "id": "j-9"})
    assert me is not None and me.job_id == "j-9" and me.name == "x:acme"


def test_bad_arguments_are_refused_at_decoration(locks: aiolock.LockManager) -> None:
    with pytest.raises(ValueError, match="on_busy must be"):
        singleton(locks, "x", on_busy="wait")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no parameter for"):

        @singleton(locks, "x:{missing}")
        async def job(present: int) -> None: ...

    with pytest.raises(TypeError, match="async functions"):
        singleton(locks, "x")(lambda: None)  # type: ignore[arg-type, return-value]


async def test_the_arq_adapter_defers_with_retry(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    Retry = pytest.importorskip("arq.worker").Retry  # arq is tested where it fits (.ci/run)

    from aiolock.contrib import arq as for_arq

    @for_arq.singleton("sync:{account}", defer=1.5)
    async def sync(ctx: dict[str, Any], account: str) -> str:
        return account

    ctx = {"locks": locks, "job_id": "j-1"}
    async with claim(other, "sync:a", job_id="j-0"):
        with pytest.raises(Retry) as caught:
            await sync(ctx, "a")
    assert caught.value.defer_score == 1500
    assert isinstance(caught.value.__cause__, JobBusy)
    assert caught.value.__cause__.holder is not None
    assert caught.value.__cause__.holder.job_id == "j-0"
    assert await sync(ctx, "a") == "a"
    with pytest.raises(LookupError, match=r"ctx\['locks'\]"):
        await sync({"job_id": "j-2"}, "a")


async def test_the_taskiq_adapter_needs_a_context_and_gives_up(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    from taskiq import Context, InMemoryBroker, TaskiqMessage

    from aiolock.contrib import taskiq as for_taskiq

    @for_taskiq.singleton(locks, "t:{n}", max_requeues=2)
    async def with_context(n: int, context: Context) -> int:
        return n

    broker = InMemoryBroker()
    message = TaskiqMessage(
        task_id="task-7", task_name="t", labels={for_taskiq.REQUEUE_LABEL: "2"}, args=[], kwargs={}
    )
    context = Context(message, broker)
    assert await with_context(1, context) == 1
    async with claim(other, "t:1"):
        with pytest.raises(JobBusy):  # requeued twice already: no more
            await with_context(1, context)
    with pytest.raises(ValueError, match="max_requeues"):
        for_taskiq.singleton(locks, "x", max_requeues=-1)


def test_the_taskiq_adapter_refuses_a_task_without_a_context_when_decorating(
    locks: aiolock.LockManager,
) -> None:
    # It used to fail only at run time: with a TypeError when the lock was busy
    # (on_busy="defer"), with a LookupError on every run (locks="<state attribute>").
    from taskiq import Context, TaskiqDepends

    from aiolock.contrib import taskiq as for_taskiq

    async def without(n: int) -> int:
        return n

    with pytest.raises(TypeError, match=r"without\(\) has no Context.*requeue"):
        for_taskiq.singleton(locks, "t:{n}")(without)
    with pytest.raises(TypeError, match=r"no Context.*context\.state\.locks"):
        for_taskiq.singleton("locks", "t:{n}", on_busy="skip")(without)
    for_taskiq.singleton(locks, "t:{n}", on_busy="skip")(without)  # needs no Context

    async def annotated(n: int, context: Context = TaskiqDepends()) -> int:  # noqa: B008
        return n

    async def by_default(n: int, context: Any = TaskiqDepends(Context)) -> int:  # noqa: B008
        return n

    for_taskiq.singleton("locks", "t:{n}")(annotated)
    for_taskiq.singleton("locks", "t:{n}")(by_default)


async def test_a_skipped_taskiq_task_returns_none_which_taskiq_parses(
    locks: aiolock.LockManager, other: aiolock.LockManager, caplog: pytest.LogCaptureFixture
) -> None:
    from taskiq import InMemoryBroker

    from aiolock.contrib import taskiq as for_taskiq

    broker = InMemoryBroker()

    @broker.task
    @for_taskiq.singleton(locks, "skip:{n}", on_busy="skip")
    async def count(n: int) -> int:
        return n

    assert typing.get_type_hints(count.original_func)["return"] == int | None
    await broker.startup()
    try:
        ran: Any = (await (await count.kiq(3)).wait_result(timeout=10)).return_value
        assert ran == 3
        async with claim(other, "skip:3"):
            skipped = await (await count.kiq(3)).wait_result(timeout=10)
    finally:
        await broker.shutdown()
    assert skipped.return_value is None and not skipped.is_err
    assert "Cannot parse return type" not in caplog.text


@pytest.mark.parametrize("wire", ["token", "timestamp", "redisson"])
async def test_a_claim_works_in_a_format_without_fencing_tokens(
    redis_url: str, prefix: str, wire: str
) -> None:
    """The shared wire formats have no fencing token (redisson: unless fence_ttl=None):
    a claim publishes its record with token None instead of failing."""
    name = f"{prefix}-job"  # raw names in these formats: keep it unique per test
    async with (
        aiolock.LockManager.from_url(redis_url, prefix=prefix, wire=wire) as locks,
        aiolock.LockManager.from_url(redis_url, prefix=prefix, wire=wire) as rival,
    ):
        async with claim(locks, name, job_id="j") as me:
            assert me.token is None and me.job_id == "j"
            assert await holder_info(rival, name) == me
            async with claim(locks, name, job_id="j"):  # re-entered: the record stays
                pass
            assert await holder_info(rival, name) == me
            with pytest.raises(JobBusy):
                async with claim(rival, name):
                    pytest.fail("the rival ran")
        assert await holder_info(rival, name) is None


def test_a_field_nested_in_a_format_spec_is_refused_when_decorating(
    locks: aiolock.LockManager,
) -> None:
    with pytest.raises(ValueError, match="nests a field"):
        singleton(locks, "report:{customer:{width}}")
    with pytest.raises(ValueError, match="nests a field"):
        singleton(locks, "report:{customer}", job_id="{job:{n}}")


async def test_a_claim_cancelled_while_it_writes_its_record_gives_the_lock_back(
    locks: aiolock.LockManager, other: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lock is taken, then the holder record's write stalls and the job is cancelled
    # there. __aexit__ never runs for an __aenter__ that raised: the lock stayed held and
    # renewed for the task's life, and the guard's scope, never exited, later cancelled
    # unrelated code of the task when that hold was lost.
    writing = asyncio.Event()

    async def stalled_set(*args: Any, **kwargs: Any) -> None:
        writing.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(locks.redis, "set", stalled_set)
    after: list[str] = []

    async def job(enter: Any) -> None:
        with pytest.raises(asyncio.CancelledError):
            await enter()
        after.append(f"held={locks.statistics().held}")
        # Lose any hold of that name: a scope left behind would cancel the code below.
        await locks.lock("cancelled:1").force_release()
        await asyncio.sleep(0.2)
        after.append("survived")

    async def with_claim() -> None:
        async with claim(locks, "cancelled:1", job_id="j"):
            pytest.fail("the body ran")

    @singleton(locks, "cancelled:{n}")
    async def single(n: int) -> None:
        pytest.fail("the job ran")

    async def with_singleton() -> None:
        await single(1)

    for enter in (with_claim, with_singleton):
        writing.clear()
        after.clear()
        task = asyncio.create_task(job(enter))
        await asyncio.wait_for(writing.wait(), 10)
        task.cancel()
        await asyncio.wait_for(task, 10)
        assert after == ["held=0", "survived"], enter.__name__
        assert locks.statistics().held == 0
        async with claim(other, "cancelled:1"):  # free for another worker at once
            pass
