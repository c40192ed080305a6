"""MultiLock: all of its names or none, in a deadlock-free order, released together."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any
from urllib.parse import urlparse

import anyio
import pytest
from redis.asyncio import Redis

import aiolock
import aiolock._kinds.multi.handle as multi_module
from aiolock._keys import LockKeys
from tests._support.helpers import eventually
from tests._support.proxy import FaultProxy


@pytest.fixture
async def other(redis_url: str, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as manager:
        yield manager


async def free(manager: aiolock.LockManager, name: str) -> bool:
    lock = manager.lock(name)
    if not await lock.try_acquire():
        return False
    await lock.release()
    return True


async def test_all_names_are_held_then_all_released(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    ml = locks.multi_lock(["acct:2", "acct:1", "acct:3"])
    assert ml.names == ["acct:1", "acct:2", "acct:3"]  # the global order
    async with ml:
        tokens = ml.fencing_tokens
        assert sorted(tokens) == ["acct:1", "acct:2", "acct:3"]
        assert all(isinstance(t, int) and t > 0 for t in tokens.values())
        for name in ("acct:1", "acct:2", "acct:3"):
            assert not await free(other, name)
        assert all((await ml.locked()).values())
    assert ml.fencing_tokens == {}
    for name in ("acct:1", "acct:2", "acct:3"):
        assert await free(other, name)


async def test_a_timeout_leaves_none_of_the_names_held(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    blocker = other.lock("b")
    await blocker.acquire()
    ml = locks.multi_lock(["a", "b", "c"])
    with pytest.raises(aiolock.LockTimeoutError, match="none of its names is held"):
        await ml.acquire(timeout=0.3)
    assert not await ml.try_acquire()
    assert not await ml.try_acquire(timeout=0.1)
    assert locks.statistics().held == 0
    assert await free(other, "a")  # taken first while it waited for "b", then given back
    assert await free(other, "c")
    await blocker.release()
    assert await ml.try_acquire()
    await ml.release()


async def test_a_cancelled_acquire_gives_back_what_it_took(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    blocker = other.lock("y")
    await blocker.acquire()
    waiter = asyncio.create_task(locks.multi_lock(["x", "y"]).acquire())
    # x is taken first (its acquire counts as a waiter too, briefly), then y is waited for
    await eventually(
        lambda: locks.statistics().hub.waiters == 1 and locks.statistics().held == 1,
        what="x held and waiting for y",
    )
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert locks.statistics().held == 0
    assert await free(other, "x")
    await blocker.release()


async def test_opposite_orders_never_deadlock(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    """Two managers ask for the same names in opposite orders, many times, with no timeout."""
    inside = 0
    overlaps = 0
    rounds = 0

    async def worker(manager: aiolock.LockManager, names: list[str], seed: int) -> None:
        nonlocal inside, overlaps, rounds
        rng = random.Random(seed)
        for _ in range(40):
            async with manager.multi_lock(names):
                inside += 1
                overlaps += inside > 1
                await asyncio.sleep(rng.choice((0, 0.001)))
                inside -= 1
                rounds += 1

    names = ["p", "q", "r"]
    await asyncio.wait_for(
        asyncio.gather(
            *(worker(locks, names, i) for i in range(3)),
            *(worker(other, names[::-1], 10 + i) for i in range(3)),
        ),
        timeout=60,
    )
    assert (rounds, overlaps) == (240, 0)


async def test_plain_locks_and_multi_locks_exclude_each_other(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    """An independent checker per name: never two holders of one name at once."""
    holders: dict[str, int] = {"m": 0, "n": 0}
    worst = 0

    async def enter(names: list[str]) -> None:
        nonlocal worst
        for name in names:
            holders[name] += 1
            worst = max(worst, holders[name])
        await asyncio.sleep(0.001)
        for name in names:
            holders[name] -= 1

    async def multi(manager: aiolock.LockManager) -> None:
        for _ in range(30):
            async with manager.multi_lock(["m", "n"]):
                await enter(["m", "n"])

    async def single(manager: aiolock.LockManager, name: str) -> None:
        for _ in range(30):
            async with manager.lock(name):
                await enter([name])

    await asyncio.wait_for(
        asyncio.gather(multi(locks), multi(other), single(locks, "m"), single(other, "n")),
        timeout=60,
    )
    assert worst == 1


async def test_losing_one_name_cancels_the_body_and_releases_the_others(
    redis_url: str, prefix: str, admin: Redis, other: aiolock.LockManager
) -> None:
    # renewed 1.5 s leases: "lose" is still held when it is force-released
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=1.5) as short:
        ml = short.multi_lock(["keep", "lose"])
        cancelled = False
        with pytest.raises(aiolock.LockLostError, match="lose"):
            async with ml:
                assert await short.lock("lose").force_release()
                try:
                    await asyncio.sleep(30)  # the loss, not the body's end, must end it
                except asyncio.CancelledError:
                    cancelled = True
                    raise
        assert cancelled
        assert short.statistics().held == 0
        assert await free(other, "keep")


async def test_a_task_that_holds_a_name_re_enters_it(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    single = locks.lock("e1")
    await single.acquire()
    ml = locks.multi_lock(["e1", "e2"])
    await ml.acquire()
    assert await single.hold_count() == 2
    await ml.release()
    assert await single.hold_count() == 1  # the task's own hold stays
    assert await free(other, "e2")
    assert not await free(other, "e1")
    await single.release()
    with pytest.raises(aiolock.LockNotOwnedError):
        await ml.release()


async def test_names_in_different_cluster_slots_work(locks: aiolock.LockManager) -> None:
    names = ["slot-a", "slot-b", "slot-c", "slot-d"]
    slots = {LockKeys(locks.prefix, name).slot for name in names}
    assert len(slots) > 1  # no single script could take them all on a cluster
    async with locks.multi_lock(names) as ml:
        assert len(ml.fencing_tokens) == 4


def test_bad_names_are_refused_at_the_call(locks: aiolock.LockManager) -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        locks.multi_lock([])
    with pytest.raises(ValueError, match=r"distinct.*'a'"):
        locks.multi_lock(["a", "b", "a"])
    with pytest.raises(TypeError, match="list"):
        locks.multi_lock("ab")
    with pytest.raises(TypeError):
        locks.multi_lock(["a", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="timeout"):
        locks.multi_lock(["a"], timeout=-1)
    with pytest.raises(ValueError, match="lease"):
        locks.multi_lock(["a"], lease=0)


CHILD = """
import asyncio, json, sys
import aiolock
from redis.asyncio import Redis

async def main(spec):
    checker = Redis.from_url(spec["url"])
    overlaps = 0
    async with aiolock.LockManager.from_url(spec["url"], prefix=spec["prefix"]) as locks:
        async def task(i):
            nonlocal overlaps
            names = spec["names"] if i % 2 == 0 else spec["names"][::-1]
            for _ in range(spec["rounds"]):
                async with locks.multi_lock(names, timeout=30):
                    counts = [await checker.incr(spec["prefix"] + ":in:" + n) for n in names]
                    overlaps += sum(c != 1 for c in counts)
                    await asyncio.sleep(0.001)
                    for n in names:
                        await checker.decr(spec["prefix"] + ":in:" + n)
        await asyncio.wait_for(asyncio.gather(*(task(i) for i in range(4))), 60)
    await checker.aclose()
    print(json.dumps({"overlaps": overlaps}))

asyncio.run(main(json.loads(sys.argv[1])))
"""


@pytest.mark.processes
async def test_multi_locks_of_several_processes_exclude_each_other(
    redis_url: str, prefix: str
) -> None:
    """Three processes, four tasks each, half of them listing the names backwards."""
    spec = {"url": redis_url, "prefix": prefix, "names": ["u", "v", "w"], "rounds": 15}
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            json.dumps(spec),
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        for _ in range(3)
    ]
    try:
        outputs = [await asyncio.wait_for(c.communicate(), 90) for c in children]
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
    assert [c.returncode for c in children] == [0, 0, 0]
    reports = [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outputs]
    assert [r["overlaps"] for r in reports] == [0, 0, 0]


# -- regressions found in review ----------------------------------------------------------


def waiting_for_the_last_name(manager: aiolock.LockManager) -> Callable[[], bool]:
    def check() -> bool:
        stats = manager.statistics()
        return stats.held == 2 and stats.hub.waiters == 1 and stats.hub.subscriptions == 1

    return check


async def test_a_cancel_scope_around_async_with_releases_every_name(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    # anyio re-delivers a scope's cancellation at every await, so it reaches each release
    # of the exit in turn: the first release used to raise it and skip the others, which
    # stayed held (and renewed) for as long as the task lived.
    ml = locks.multi_lock(["a", "b", "c"])
    with anyio.move_on_after(0.2):
        async with ml:
            await asyncio.sleep(10)
    assert locks.statistics().held == 0
    for name in ("a", "b", "c"):
        assert await free(other, name)


async def test_a_cancelled_release_still_releases_every_name(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    ml = locks.multi_lock(["a", "b", "c"])
    await ml.acquire()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await ml.release()
    assert scope.cancelled_caught
    assert locks.statistics().held == 0
    for name in ("a", "b", "c"):
        assert await free(other, name)


async def test_a_second_cancel_inside_the_unwind_still_releases_every_name(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis
) -> None:
    # The unwind is shielded from anyio, not from a native task.cancel(): one arriving
    # while the unwind releases a name used to stop it there, leaving the names before
    # it held while the task lived on.
    blocker = other.lock("c")
    await blocker.acquire()
    ml = locks.multi_lock(["a", "b", "c"])
    held_after: list[int] = []

    async def acquire() -> None:
        try:
            await ml.acquire()
        except asyncio.CancelledError:
            held_after.append(locks.statistics().held)  # the task lives on here

    task = asyncio.create_task(acquire())
    await eventually(waiting_for_the_last_name(locks), what="a and b held, waiting for c")
    await admin.client_pause(400, all=True)  # the unwind stalls
    task.cancel()
    await asyncio.sleep(0.1)
    task.cancel()
    await asyncio.wait_for(task, 10)
    assert held_after == [0]
    await blocker.release()
    for name in ("a", "b", "c"):
        assert await free(other, name)


async def test_anyio_fail_after_around_a_multi_acquire_leaves_nothing_held(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    blocker = other.lock("c")
    await blocker.acquire()
    ml = locks.multi_lock(["a", "b", "c"])
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.3):
            await ml.acquire()
    assert locks.statistics().held == 0
    await blocker.release()
    for name in ("a", "b", "c"):
        assert await free(other, name)


async def test_an_unwind_past_its_bound_still_raises_the_timeout(
    redis_url: str, prefix: str, other: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The unwind's own time bound cancels a slow release: that cancellation is the
    # bound's, and must not turn the caller's LockTimeoutError into a CancelledError.
    monkeypatch.setattr(multi_module, "UNWIND_TIMEOUT", 0.05)
    upstream = urlparse(redis_url)
    assert upstream.hostname is not None and upstream.port is not None
    blocker = other.lock("c")
    await blocker.acquire()
    async with (
        FaultProxy(upstream.hostname, upstream.port) as proxy,
        aiolock.LockManager.from_url(proxy.url, prefix=prefix) as slow,
    ):
        task = asyncio.create_task(slow.multi_lock(["a", "b", "c"]).acquire(timeout=0.5))
        await eventually(waiting_for_the_last_name(slow), what="a and b held, waiting for c")
        proxy.set_latency(0.1)  # each release of the unwind takes longer than its bound
        with pytest.raises(aiolock.LockTimeoutError):
            await asyncio.wait_for(task, 10)
        proxy.set_latency(0)
        await eventually(lambda: slow.statistics().held == 0, what="all released")
        await eventually(lambda: slow.statistics().pending_cleanups == 0, what="retries done")
    await blocker.release()
    for name in ("a", "b", "c"):
        assert await free(other, name)


# -- a name lost while the others were waited for (issue 18, item 1) --------------------
#
# The multi-lock takes "lost-a" with a fixed lease of 1 s, then waits for "lost-b" (held
# by another manager) longer than that; meanwhile "lost-a"'s lease ends and another
# owner takes it. The acquire must not return holding "lost-b" alone: it used to, and
# its body ran uncancelled with fencing_tokens == {}, LockLostError only at the exit.


async def _lose_the_first_name_while_waiting(
    locks: aiolock.LockManager,
    other: aiolock.LockManager,
    acquire: Callable[[], Coroutine[Any, Any, object]],
) -> BaseException | None:
    """Run *acquire* (a multi-acquire of lost-a and lost-b) through that scenario; what
    it raised. Checks that it holds nothing after and that the new owner of lost-a keeps it."""
    blocker = other.lock("lost-b")
    await blocker.acquire()
    task = asyncio.create_task(acquire())
    try:
        await eventually(
            lambda: locks.statistics().held == 1 and locks.statistics().hub.waiters == 1,
            what="lost-a held, waiting for lost-b",
        )
        taker = other.lock("lost-a")
        await taker.acquire(timeout=30)  # once lost-a's lease of 1 s has ended
        await eventually(lambda: locks.statistics().held == 0, what="lost-a lost locally")
        await blocker.release()
        outcome = (await asyncio.wait([task], timeout=30))[0]
        assert outcome, "the multi-acquire did not return"
    finally:
        task.cancel()
    assert locks.statistics().held == 0
    assert await free(other, "lost-b")  # given back
    assert await taker.owned()  # the give-back did not free the new owner's hold
    await taker.release()
    return task.exception()


async def test_an_acquire_never_returns_a_name_lost_meanwhile(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    ml = locks.multi_lock(["lost-a", "lost-b"], lease=1.0)
    error = await _lose_the_first_name_while_waiting(locks, other, ml.acquire)
    assert isinstance(error, aiolock.LockLostError)
    assert "lost-a" in str(error) and "holds none of them" in str(error)
    with pytest.raises(aiolock.LockNotOwnedError):
        await ml.release()  # the acquire raised: nothing is held, nothing is lost


async def test_async_with_never_runs_its_body_without_every_name(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    ml = locks.multi_lock(["lost-a", "lost-b"], lease=1.0)
    tokens: list[dict[str, int]] = []

    async def enter() -> None:
        async with ml:
            tokens.append(ml.fencing_tokens)

    error = await _lose_the_first_name_while_waiting(locks, other, enter)
    assert isinstance(error, aiolock.LockLostError)
    assert tokens == []


async def test_the_locked_decorator_never_runs_without_every_name(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    ran: list[str] = []

    @locks.locked(["lost-{x}", "lost-{y}"], lease=1.0)
    async def job(x: str, y: str) -> None:
        ran.append(x + y)

    async def call() -> None:
        await job("a", "b")

    error = await _lose_the_first_name_while_waiting(locks, other, call)
    assert isinstance(error, aiolock.LockLostError)
    assert ran == []


async def test_a_re_entered_fixed_lease_hold_lost_meanwhile_is_not_returned(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    single = locks.lock("lost-a", lease=1.0)
    ran: list[bool] = []
    outer: list[BaseException] = []

    async def enter() -> None:
        await single.acquire()
        try:
            async with locks.multi_lock(["lost-a", "lost-b"], lease=1.0):
                ran.append(True)
        finally:
            with pytest.raises(aiolock.LockLostError) as info:
                await single.release()  # the outer hold was lost too, and says so
            outer.append(info.value)

    error = await _lose_the_first_name_while_waiting(locks, other, enter)
    assert isinstance(error, aiolock.LockLostError)
    assert ran == []
    assert len(outer) == 1
