"""The observer hook: which events each step of a hold's life reports, for every kind."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

import aiolock
from aiolock import LockManager, Observer
from aiolock._observe import ObservedManager
from tests._support.helpers import eventually


class Recorder(Observer):
    """Every event, in order, as a tuple (durations left out unless asked for)."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.managers: list[ObservedManager] = []
        self.durations: list[float] = []

    def attached(self, manager: ObservedManager) -> None:
        self.managers.append(manager)

    def acquire_started(self, kind: str, name: str) -> None:
        self.events.append(("start", kind, name))

    def acquired(self, kind: str, name: str, waited_s: float, token: int) -> None:
        self.durations.append(waited_s)
        self.events.append(("acquired", kind, name, token))

    def acquire_failed(self, kind: str, name: str, waited_s: float, reason: str) -> None:
        self.durations.append(waited_s)
        self.events.append(("failed", kind, name, reason))

    def released(self, kind: str, name: str, held_s: float, token: int) -> None:
        self.durations.append(held_s)
        self.events.append(("released", kind, name, token))

    def lost(self, kind: str, name: str, held_s: float, token: int, reason: str) -> None:
        self.durations.append(held_s)
        self.events.append(("lost", kind, name, token, reason))

    def renewed(self, kind: str, count: int, round_trip_s: float) -> None:
        self.events.append(("renewed", kind, count))

    def of(self, what: str) -> list[tuple[Any, ...]]:
        return [event for event in self.events if event[0] == what]


@pytest.fixture
async def observed(redis: Redis, prefix: str) -> Any:
    recorder = Recorder()
    async with LockManager(redis, prefix=prefix, observers=[recorder]) as manager:
        yield manager, recorder


async def test_a_hold_reports_its_wait_and_its_release(observed: Any) -> None:
    locks, seen = observed
    assert seen.managers == [locks]
    async with locks.lock("a") as lock:
        token = lock.fencing_token
        async with lock:  # a re-entry is no new hold: nothing reported
            pass
    assert seen.events == [
        ("start", "lock", "a"),
        ("acquired", "lock", "a", token),
        ("released", "lock", "a", token),
    ]
    assert all(0 <= d < 5 for d in seen.durations)


async def test_timeouts_and_cancellations_are_failed_waits(observed: Any) -> None:
    locks, seen = observed
    held = asyncio.Event()
    done = asyncio.Event()

    async def holder() -> None:
        async with locks.lock("b"):
            held.set()
            await done.wait()

    task = asyncio.create_task(holder())
    await held.wait()
    assert not await locks.lock("b").try_acquire(timeout=0)
    assert not await locks.lock("b").try_acquire(timeout=0.05)
    waiter = asyncio.create_task(locks.lock("b").acquire())
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    done.set()
    await task
    assert [e[3] for e in seen.of("failed")] == ["timeout", "timeout", "cancelled"]
    assert seen.durations[2] >= 0.04  # the 0.05 s wait (index 0 is the holder's wait)
    assert len(seen.of("acquired")) == len(seen.of("released")) == 1


async def test_every_kind_reports_each_hold_once(observed: Any) -> None:
    locks, seen = observed
    async with locks.fair_lock("f"):
        pass
    rw = locks.rw_lock("rw")
    async with rw.read(), rw.read():
        pass
    async with rw.write():
        pass
    sem = locks.semaphore("s", 3)
    permit = await sem.acquire(permits=2)
    await permit.release()
    async with locks.multi_lock(["m1", "m2"]):
        pass
    acquired = [(e[1], e[2]) for e in seen.of("acquired")]
    assert acquired == [
        ("fair lock", "f"),
        ("read lock", "rw"),
        ("write lock", "rw"),
        ("semaphore", "s"),
        ("lock", "m1"),
        ("lock", "m2"),
    ]
    assert sorted(e[1:] for e in seen.of("acquired")) == sorted(e[1:] for e in seen.of("released"))
    assert not seen.of("failed")
    assert not seen.of("lost")


async def test_a_lost_hold_reports_lost_not_released(observed: Any, admin: Redis) -> None:
    locks, seen = observed
    lock = locks.lock("c")
    with pytest.raises(aiolock.LockLostError):
        async with lock:
            await lock.force_release()
            await asyncio.sleep(1)
    (lost,) = seen.of("lost")
    assert lost[:3] == ("lost", "lock", "c")
    assert "force-released" in lost[4]
    assert not seen.of("released")


async def test_a_hold_lost_in_redis_is_reported_by_the_watchdog(
    redis: Redis, prefix: str, admin: Redis
) -> None:
    seen = Recorder()
    # The watchdog's rounds run here (the timer's first is 10 s away on the 30 s lease):
    # on a short lease, a loaded machine that stalled them let the hold run out by the
    # client's clock, a loss of another reason.
    async with LockManager(redis, prefix=prefix, observers=[seen]) as locks:
        watchdog = locks._open_engine().watchdog
        lock = locks.lock("d")
        with pytest.raises(aiolock.LockLostError):
            async with lock:
                assert await watchdog.renew_all()
                assert seen.of("renewed")[0][:2] == ("renewed", "lock")
                await admin.delete(lock.key)
                assert await watchdog.renew_all()  # it answers: the hold is gone
                await asyncio.sleep(30)  # the loss, not the body's end, must end it
    (lost,) = seen.of("lost")
    assert "Redis no longer has it" in lost[4]


async def test_a_task_that_ends_holding_reports_a_release(observed: Any) -> None:
    locks, seen = observed

    async def forgetful() -> None:
        await locks.lock("e").acquire()

    await asyncio.create_task(forgetful())
    # The task's done callback releases in the background (a round trip): waited for, not
    # slept on, as it takes longer on a loaded machine.
    await eventually(lambda: len(seen.events) >= 3, what="the background release's event")
    assert [e[0] for e in seen.events] == ["start", "acquired", "released"]


async def test_closing_the_manager_reports_holds_lost(redis: Redis, prefix: str) -> None:
    seen = Recorder()
    locks = await LockManager(redis, prefix=prefix).open()
    locks.add_observer(seen)
    locks.add_observer(seen)  # once
    await locks.lock("g").acquire()
    await locks.aclose()
    assert [e[0] for e in seen.events] == ["start", "acquired", "lost"]
    assert "closed" in seen.events[-1][4]


async def test_a_failing_observer_is_logged_once_and_breaks_nothing(
    observed: Any, caplog: pytest.LogCaptureFixture
) -> None:
    locks, seen = observed

    class Broken(Observer):
        def acquired(self, kind: str, name: str, waited_s: float, token: int) -> None:
            raise RuntimeError("observer bug")

    broken = Broken()
    locks.add_observer(broken)
    with caplog.at_level(logging.ERROR, logger="aiolock"):
        for _ in range(3):
            async with locks.lock("h"):
                pass
    failures = [r for r in caplog.records if "observer" in r.getMessage()]
    assert len(failures) == 1
    assert "acquired()" in failures[0].getMessage()
    assert len(seen.of("released")) == 3  # the others still hear everything
    locks.remove_observer(broken)
    locks.remove_observer(broken)  # harmless


async def test_removed_observers_hear_nothing_and_types_are_checked(observed: Any) -> None:
    locks, seen = observed
    locks.remove_observer(seen)
    async with locks.lock("i"):
        pass
    assert seen.events == []
    with pytest.raises(TypeError, match=r"aiolock\.Observer"):
        locks.add_observer(object())


async def test_from_url_takes_observers(redis_url: str, prefix: str) -> None:
    seen = Recorder()
    locks = LockManager.from_url(redis_url, prefix=prefix, observers=[seen])
    async with locks, locks.lock("j"):
        pass
    assert [e[0] for e in seen.events] == ["start", "acquired", "released"]


async def test_churn_every_start_has_one_outcome_and_every_hold_one_end(
    redis: Redis, prefix: str
) -> None:
    """Tasks of every kind acquire with timeouts, get cancelled, and forget to release."""
    seen = Recorder()
    rounds = 0
    async with LockManager(redis, prefix=prefix, observers=[seen]) as locks:
        sem = locks.semaphore("s", 2)
        rw = locks.rw_lock("rw")
        makers: list[Any] = [
            lambda: locks.lock("l", timeout=0.02),
            lambda: locks.fair_lock("f", timeout=0.02),
            rw.read,
            rw.write,
            lambda: sem,
            lambda: locks.multi_lock(["l", "m"], timeout=0.02),
        ]

        async def worker(i: int) -> None:
            lock = makers[i % len(makers)]()
            try:
                if i % 7 == 0:  # ends holding: aiolock releases it
                    await asyncio.wait_for(lock.acquire(timeout=0.02), 1)
                    return
                with anyio.fail_after(0.004 * (i % 6)):  # may cancel a wait or a body
                    async with lock:
                        await asyncio.sleep(0.005)
            # wait_for's asyncio.TimeoutError is not the builtin TimeoutError before 3.11
            except (TimeoutError, asyncio.TimeoutError, aiolock.LockTimeoutError):
                pass

        deadline = asyncio.get_running_loop().time() + 3
        while rounds < 20 and asyncio.get_running_loop().time() < deadline:
            await asyncio.gather(*(worker(rounds * 12 + i) for i in range(12)))
            rounds += 1
        # Tasks that ended holding are released in the background: wait until every
        # acquisition has ended (a release or a loss), however loaded the machine.
        await eventually(
            lambda: len(seen.of("acquired")) == len(seen.of("released")) + len(seen.of("lost")),
            what="the background releases of the tasks that ended holding",
        )
    starts = len(seen.of("start"))
    outcomes = len(seen.of("acquired")) + len(seen.of("failed"))
    assert starts == outcomes > 0
    acquired = sorted(e[1:] for e in seen.of("acquired"))
    ended = sorted([e[1:] for e in seen.of("released")] + [e[1:4] for e in seen.of("lost")])
    assert acquired == ended
    assert "cancelled" in {e[3] for e in seen.of("failed")} <= {"timeout", "cancelled"}
    assert seen.of("failed") and seen.of("released")
