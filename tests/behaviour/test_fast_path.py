"""The engine's fast path (issue 21): which acquisitions and releases take it, and that
every case it must not handle falls back to the engine's full path.

The fast path counts what it does (``Engine.fast_acquired`` / ``fast_released``); the
engine counts every new hold (``acquired``). A case that must fall back is shown by the
fast counters standing still while the engine's count moves. (The replica case is in
``test_replicas.py``; on a Redis Cluster the fast path runs, and an attempt whose
redirects surface as an error falls back to the engine's wait: ``test_cluster.py``.)
"""

from __future__ import annotations

import asyncio
import os
import sys
from types import FrameType
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.engine import Engine
from aiolock._engine.hub import WaiterHub
from aiolock._engine.kind import Attempt, Busy, Granted
from aiolock._errors import LockConnectionError
from tests._support.helpers import eventually, within


def engine_of(locks: aiolock.LockManager) -> Engine:
    engine = locks._engine
    assert engine is not None
    return engine


def counts(locks: aiolock.LockManager) -> tuple[int, int, int]:
    """(fast acquisitions, fast releases, all new holds of the 'lock' kind)."""
    engine = engine_of(locks)
    return engine.fast_acquired, engine.fast_released, engine.acquired["lock"]


async def test_an_uncontended_cycle_takes_the_fast_path(locks: aiolock.LockManager) -> None:
    lock = locks.lock("free")
    async with lock:
        assert await lock.owned()
    assert counts(locks) == (1, 1, 1)
    assert await lock.try_acquire()  # one attempt (timeout=0) too
    await lock.release()
    await lock.acquire(timeout=5)
    assert lock.fencing_token is not None
    await lock.release()
    assert counts(locks) == (3, 3, 3)
    assert not await lock.locked()
    assert locks.statistics().hub.queues == 0  # the fast path left no queue behind


async def test_contention_falls_back_to_the_engine(
    locks: aiolock.LockManager, redis: Redis, prefix: str
) -> None:
    async def wait_for_it() -> tuple[int, int, int]:
        lock = locks.lock("busy")
        await lock.acquire(timeout=10)
        got = counts(locks)
        await lock.release()
        return got

    async with aiolock.LockManager(redis, prefix=prefix) as other:
        await other.lock("busy").acquire()
        assert not await locks.lock("busy").try_acquire()  # Busy: a timeout, no hold
        assert counts(locks) == (0, 0, 0)
        waiter = asyncio.create_task(wait_for_it())
        await eventually(lambda: locks.statistics().hub.waiters == 1, what="the waiter")
        await other.lock("busy").release()
        # Its fast attempt found the lock busy: the engine's wait took it from there.
        assert await within(waiter, what="the waiter to acquire") == (0, 0, 1)
    assert not await locks.lock("busy").locked()


async def test_local_waiters_are_handed_the_lock_by_the_engine(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("local")
    entered = [asyncio.Event() for _ in range(3)]
    leave = [asyncio.Event() for _ in range(3)]

    async def user(i: int) -> None:
        async with lock:
            entered[i].set()
            await leave[i].wait()

    tasks = [asyncio.create_task(user(0))]
    await within(entered[0].wait(), what="the holder")
    assert counts(locks) == (1, 0, 1)
    tasks.append(asyncio.create_task(user(1)))  # fast attempt, Busy: waits as the head
    await eventually(lambda: locks.statistics().hub.waiters == 1, what="the waiter")
    tasks.append(asyncio.create_task(user(2)))  # a queue exists: the engine's wait
    await eventually(lambda: locks.statistics().hub.waiters == 2, what="the second waiter")
    leave[0].set()
    await within(entered[1].wait(), what="the first hand-over")
    assert counts(locks) == (1, 0, 2)  # the engine's release handed it over
    leave[1].set()
    await within(entered[2].wait(), what="the second hand-over")
    assert counts(locks) == (1, 0, 3)
    leave[2].set()
    await within(asyncio.gather(*tasks), what="the users")
    assert engine_of(locks).fast_acquired == 1
    assert not await lock.locked()


async def test_a_reentry_and_a_nested_release_take_the_engine(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("nested")
    async with lock:
        async with lock:
            assert await lock.hold_count() == 2
        assert counts(locks) == (1, 0, 1)  # re-entry and the nested release: the engine
        assert await lock.hold_count() == 1
    assert counts(locks) == (1, 1, 1)  # the final release, with nobody waiting: fast


async def test_a_release_sends_the_successor_arguments_only_with_a_successor(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: a final release with nobody to hand over to (its manager not listening,
    the default fence_ttl) sends ARGV 1-2 of the release script, a nested one 1-5, a
    hand-over all 9; a new acquisition sends ARGV 1-2 of the acquire script, a re-entry all
    4. (Before, a release sent 9, then 5, and every acquisition 4.)"""
    client: Any = locks._client
    original = client.run
    sent: list[int] = []
    attempts: list[int] = []

    def recorded(script: Any, keys: Any, args: Any) -> Any:
        if script.name == "_kinds/lock/release":
            sent.append(len(args))
        elif script.name == "_kinds/lock/acquire":
            attempts.append(len(args))
        return original(script, keys, args)

    monkeypatch.setattr(client, "run", recorded)
    lock = locks.lock("arguments")
    async with lock, lock:  # a hold and its re-entry: a nested release, then the final one
        pass
    assert sent == [5, 2]  # the nested release, then the final one
    assert attempts == [2, 4]  # the new acquisition, then the re-entry
    entered, leave = asyncio.Event(), asyncio.Event()

    async def waiter() -> None:
        async with lock:
            entered.set()
            await leave.wait()

    async with lock:
        task = asyncio.create_task(waiter())
        await eventually(lambda: locks.statistics().hub.waiters == 1, what="the waiter")
    await within(entered.wait(), what="the hand-over")
    assert sent == [5, 2, 9]  # the hand-over
    leave.set()
    await within(task, what="the waiter's release")


@pytest.mark.parametrize(("fence_ttl", "sent", "kept"), [(None, 3, -1), (20.0, 3, 20_000)])
async def test_a_release_names_a_keep_other_than_the_default(
    redis: Redis, prefix: str, fence_ttl: float | None, sent: int, kept: int
) -> None:
    """Issue 21: the release script reads a left-out ARGV[3] as the default keep (60 s);
    a manager with another fence_ttl sends its own, and the free state is kept that long
    (no expiry with fence_ttl=None)."""
    async with aiolock.LockManager(redis, prefix=prefix, fence_ttl=fence_ttl) as locks:
        client: Any = locks._client
        original = client.run
        counted: list[int] = []

        def recorded(script: Any, keys: Any, args: Any) -> Any:
            if script.name == "_kinds/lock/release":
                counted.append(len(args))
            return original(script, keys, args)

        client.run = recorded
        lock = locks.lock("kept")
        async with lock:
            pass
        assert counted == [sent]
        pttl = await redis.pttl(f"{prefix}:lock:{{kept}}")
        if kept < 0:
            assert pttl == kept, pttl
        else:
            assert kept - 10_000 < pttl <= kept, pttl


async def test_observers_turn_the_fast_path_off(locks: aiolock.LockManager) -> None:
    seen: list[str] = []

    class Seen(aiolock.Observer):
        def acquired(self, kind: str, name: str, waited: float, token: int | None) -> None:
            seen.append(f"acquired {name}")

        def released(self, kind: str, name: str, held: float, token: int | None) -> None:
            seen.append(f"released {name}")

    observer = Seen()
    locks.add_observer(observer)
    async with locks.lock("seen"):
        pass
    assert seen == ["acquired seen", "released seen"]
    assert counts(locks) == (0, 0, 1)
    locks.remove_observer(observer)
    async with locks.lock("seen"):
        pass
    assert counts(locks) == (1, 1, 2)


async def test_kinds_with_claims_take_the_engine(locks: aiolock.LockManager) -> None:
    async with locks.fair_lock("fair"):
        pass
    async with locks.semaphore("sem", 2):
        pass
    rw = locks.rw_lock("rw")
    async with rw.write():
        pass
    engine = engine_of(locks)
    assert engine.fast_acquired == 0
    async with rw.read():  # the read side has no claims: it may take it
        pass
    assert engine.fast_acquired == 1


async def test_a_manager_that_stopped_acquiring_refuses_through_the_engine(
    locks: aiolock.LockManager,
) -> None:
    lock = locks.lock("stopping")
    await lock.acquire()
    locks.stop_acquiring()
    with pytest.raises(aiolock.ManagerNotOpenError):
        await locks.lock("other").acquire(timeout=1)
    await lock.release()  # the hub is closed: the engine's release
    assert counts(locks) == (1, 0, 1)
    assert not await lock.locked()


@pytest.mark.parametrize("timeout", [None, 0])
async def test_a_cancel_during_the_fast_attempt_still_undoes_it(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch, timeout: float | None
) -> None:
    """The script ran and granted the lock, but the reply never reached the task: the
    undo reverts it, exactly as for the engine's own attempts."""
    lock = locks.lock("cancelled")
    kind = lock._kind
    sent = asyncio.Event()
    undone: list[Attempt] = []
    real_attempt, real_undo = kind.attempt, kind.undo

    async def attempt(attempt: Attempt) -> Granted | Busy:
        outcome = await real_attempt(attempt)  # granted in Redis...
        sent.set()
        await asyncio.Event().wait()  # ...and the reply stuck until the cancel comes
        return outcome

    async def undo(attempt: Attempt) -> bool:
        undone.append(attempt)
        return await real_undo(attempt)

    monkeypatch.setattr(kind, "attempt", attempt)
    monkeypatch.setattr(kind, "undo", undo)
    task = asyncio.create_task(lock.acquire(timeout=timeout))
    await within(sent.wait(), what="the attempt to run")
    assert await lock.locked()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(undone) == 1
    assert not await lock.locked()  # undone: nobody holds it
    assert counts(locks) == (0, 0, 0)
    assert locks.statistics().held == 0
    assert locks.statistics().hub.queues == 0  # the wait's exit left the queue


async def test_a_connection_error_in_the_fast_attempt_is_undone_and_ridden_out(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = locks.lock("flaky")
    kind = lock._kind
    undone: list[Attempt] = []
    real_attempt, real_undo = kind.attempt, kind.undo
    failures = [LockConnectionError("the reply was lost")]

    async def attempt(attempt: Attempt) -> Granted | Busy:
        outcome = await real_attempt(attempt)
        if failures:
            raise failures.pop()
        return outcome

    async def undo(attempt: Attempt) -> bool:
        undone.append(attempt)
        return await real_undo(attempt)

    monkeypatch.setattr(kind, "attempt", attempt)
    monkeypatch.setattr(kind, "undo", undo)
    await lock.acquire(timeout=10)  # (bounded by its own timeout; wait_for's task would own it)
    assert len(undone) == 1  # the first attempt's grant was reverted
    assert await lock.hold_count() == 1
    assert engine_of(locks).connection_errors == 1
    assert counts(locks) == (0, 0, 1)  # acquired by the engine's retry
    await lock.release()
    assert not await lock.locked()


async def test_call_order_is_kept_with_the_fast_path(locks: aiolock.LockManager) -> None:
    """Tasks that ask while a fast attempt is in flight queue behind it, in call order."""
    order: list[int] = []

    async def user(i: int) -> None:
        async with locks.lock("order"):
            order.append(i)
            await asyncio.sleep(0)

    await within(asyncio.gather(*(user(i) for i in range(8))), what="the users")
    assert order == list(range(8))
    assert engine_of(locks).fast_acquired == 1


# -- the fast path's lazy queue entry (issue 21) ----------------------------------------
#
# The fast path joins its lock's queue lazily (WaiterHub.enter): while its one attempt is in
# flight, an entry stands for the queue and its head waiter, which are made only when
# somebody needs them. These tests hold an attempt in flight and make each such somebody
# come: the rules of the queue must apply exactly as if the waiter had been made at once.


class _InFlight:
    """Holds the replies of *kind*'s attempts (each ran in Redis) until :attr:`let_go`
    is set; :attr:`sent` counts the attempts that ran."""

    def __init__(self, kind: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.let_go = asyncio.Event()
        self.sent = 0
        real = kind.attempt

        async def attempt(attempt: Attempt) -> Granted | Busy:
            outcome: Granted | Busy = await real(attempt)
            self.sent += 1
            await self.let_go.wait()
            return outcome

        monkeypatch.setattr(kind, "attempt", attempt)


def hub_of(locks: aiolock.LockManager) -> WaiterHub:
    return engine_of(locks).hub


def queue_sizes(locks: aiolock.LockManager) -> tuple[int, int]:
    stats = locks.statistics().hub
    return stats.queues, stats.waiters


async def test_a_fast_attempt_in_flight_makes_no_queue_but_counts_as_one(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody looks: no queue nor waiter is made (before: both, for every acquisition),
    and the statistics count the entry as the queue of one waiter it stands for."""
    lock = locks.lock("lazy")
    hub = hub_of(locks)
    flight = _InFlight(lock._kind, monkeypatch)
    held, leave = asyncio.Event(), asyncio.Event()

    async def user() -> None:
        async with lock:
            held.set()
            await leave.wait()

    task = asyncio.create_task(user())
    await eventually(lambda: flight.sent == 1, what="the attempt to run")
    assert queue_sizes(locks) == (1, 1)
    assert hub._queues == {} and list(hub._lazy) == [lock._keys.channel]
    assert hub.admission.taken == 1  # its turn among the woken waiters, as a waiter's
    flight.let_go.set()
    await within(held.wait(), what="the acquisition")
    assert queue_sizes(locks) == (0, 0)
    assert hub._lazy == {} and hub._queues == {} and hub.admission.taken == 0
    assert counts(locks) == (1, 0, 1)
    leave.set()
    await within(task, what="the release")


async def test_a_task_asking_while_a_fast_attempt_is_in_flight_queues_behind_it(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second task's join makes the first's queue and waiter: it waits behind it
    (no attempt of its own meanwhile), and is handed the lock when the first releases."""
    lock = locks.lock("behind")
    hub = hub_of(locks)
    flight = _InFlight(lock._kind, monkeypatch)
    order: list[str] = []
    leave = asyncio.Event()

    async def user(me: str) -> None:
        async with lock:
            order.append(me)
            await leave.wait()

    first = asyncio.create_task(user("first"))
    await eventually(lambda: flight.sent == 1, what="the first attempt to run")
    second = asyncio.create_task(user("second"))
    await eventually(lambda: queue_sizes(locks) == (1, 2), what="the second waiter")
    assert hub._lazy == {}  # the entry became the head of a real queue
    head, behind = hub._queues[lock._keys.channel].waiters
    assert head.task is first and behind.task is second
    assert head.turn and hub.admission.taken == 1  # the entry's turn is its waiter's
    await asyncio.sleep(0.05)
    assert flight.sent == 1  # the second waits its turn: no attempt of its own
    flight.let_go.set()
    await eventually(lambda: order == ["first"], what="the first holder")
    leave.set()
    await within(asyncio.gather(first, second), what="both users")
    assert order == ["first", "second"]  # call order kept
    assert counts(locks) == (1, 1, 2)  # the second by the engine's hand-over
    assert queue_sizes(locks) == (0, 0) and hub.admission.taken == 0
    assert not await lock.locked()


def _release_arguments(locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many arguments each lock release script sent carries, in order (9: with a
    successor to hand the lock to, 2: without)."""
    client: Any = locks._client
    original = client.run
    sent: list[int] = []

    def recorded(script: Any, keys: Any, args: Any) -> Any:
        if script.name == "_kinds/lock/release":
            sent.append(len(args))
        return original(script, keys, args)

    monkeypatch.setattr(client, "run", recorded)
    return sent


async def test_a_local_release_hands_the_lock_to_a_fast_attempt_in_flight(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A holder of the same manager releases while a fast attempt (which found the lock
    busy) is in flight: the successor is its waiter, made from the entry, and it gets
    the lock by the hand-over (the release script with its successor: 9 arguments)."""
    lock = locks.lock("handed")
    hub = hub_of(locks)
    sent = _release_arguments(locks, monkeypatch)
    await lock.acquire()
    flight = _InFlight(lock._kind, monkeypatch)

    async def waiter() -> int:
        await lock.acquire(timeout=10)
        try:
            return await lock.hold_count()
        finally:
            await lock.release()

    task = asyncio.create_task(waiter())
    await eventually(lambda: flight.sent == 1, what="the busy attempt to run")
    assert len(hub._lazy) == 1
    await lock.release()
    assert sent == [9]  # handed over to the waiter made from the entry
    assert hub._lazy == {} and queue_sizes(locks) == (1, 1)
    flight.let_go.set()
    assert await within(task, what="the waiter") == 1
    assert sent == [9, 2]  # its own release: nobody to hand it to
    assert counts(locks) == (1, 1, 2)
    assert queue_sizes(locks) == (0, 0) and hub.admission.taken == 0
    assert not await lock.locked()


async def test_a_local_release_wakes_a_fast_attempt_in_flight(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release that hands nothing over (the write side of a read-write lock) wakes the
    local head: a fast attempt (a reader's, busy) in flight keeps that wake, and its wait
    tries again at once, as a waiter made at the start would."""
    rw = locks.rw_lock("woken")
    hub = hub_of(locks)
    writer = rw.write()
    await writer.acquire()
    reader = rw.read()
    flight = _InFlight(reader._kind, monkeypatch)

    async def read() -> None:
        await reader.acquire(timeout=10)
        await reader.release()

    task = asyncio.create_task(read())
    await eventually(lambda: flight.sent == 1, what="the reader's busy attempt")
    assert len(hub._lazy) == 1
    await writer.release()
    assert hub._lazy == {}
    (head,) = hub._queues[reader._keys.channel].waiters
    assert head.task is task and head.pending  # the wake, kept for its wait
    flight.let_go.set()
    await within(task, what="the reader")
    assert flight.sent == 2  # tried again at once
    assert queue_sizes(locks) == (0, 0) and hub.admission.taken == 0


async def test_a_fast_attempt_cancelled_in_flight_is_no_successor(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task cancelled while its fast attempt is in flight, and a local release before
    the task sees it: the waiter made from the entry is its task's, being cancelled, so
    the lock is freed for others rather than handed to it (Python 3.11+ tells; on 3.10
    it is handed over and passed on). The cancellation undoes the attempt as before."""
    lock = locks.lock("cancelled-in-flight")
    hub = hub_of(locks)
    sent = _release_arguments(locks, monkeypatch)
    await lock.acquire()
    flight = _InFlight(lock._kind, monkeypatch)
    task = asyncio.create_task(lock.acquire(timeout=10))
    await eventually(lambda: flight.sent == 1, what="the busy attempt to run")
    task.cancel()
    await lock.release()  # before the task runs again: its entry is still lazy
    if sys.version_info >= (3, 11):
        assert sent == [2]  # freed, not handed over
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: queue_sizes(locks) == (0, 0), what="the queue left")
    assert hub._lazy == {} and hub._queues == {} and hub.admission.taken == 0
    await eventually(lambda: locks.statistics().pending_cleanups == 0, what="cleanups")
    assert not await lock.locked()
    assert locks.statistics().held == 0


async def test_lazy_entries_take_turns_within_the_wakes_bound(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most Admission.WAKES first attempts in flight, lazy or not: an entry holds a
    turn, its waiter keeps that turn when it is made, the others wait in line as
    waiters, and each entry dropped admits the next."""
    hub = hub_of(locks)
    monkeypatch.setattr(hub.admission, "WAKES", 2)
    names = [f"turns{i}" for i in range(6)]
    flight = _InFlight(locks.lock(names[0])._kind, monkeypatch)
    in_flight = peak = 0
    real = locks.lock(names[0])._kind.attempt

    async def counted(attempt: Attempt) -> Granted | Busy:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            return await real(attempt)
        finally:
            in_flight -= 1

    monkeypatch.setattr(locks.lock(names[0])._kind, "attempt", counted)

    async def user(name: str) -> None:
        async with locks.lock(name, timeout=10):
            pass

    tasks = [asyncio.create_task(user(name)) for name in names]
    await eventually(lambda: flight.sent == 2, what="two attempts in flight")
    assert len(hub._lazy) == 2 and hub.admission.taken == 2
    assert queue_sizes(locks) == (6, 6)  # two entries, four waiters in line
    in_line = [w for q in hub._queues.values() for w in q.waiters]
    assert len(in_line) == 4 and all(w.deferred for w in in_line)
    # One more task for the first name: it makes that entry's waiter, which keeps its turn.
    tasks.append(asyncio.create_task(user(names[0])))
    await eventually(lambda: queue_sizes(locks) == (6, 7), what="the seventh waiter")
    assert len(hub._lazy) == 1 and hub.admission.taken == 2
    flight.let_go.set()
    await within(asyncio.gather(*tasks), what="every user")
    assert peak <= 2, peak
    assert hub._lazy == {} and hub.admission.taken == 0 and queue_sizes(locks) == (0, 0)
    assert engine_of(locks).fast_acquired == 6  # the seventh waited behind the first


async def test_the_hub_closing_with_a_lazy_entry_in_flight(
    locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub closes (stop_acquiring) while a fast attempt, granted in Redis, is in
    flight: its waiter is made and woken as every other, and the attempt's grant is given
    back when it lands (the manager closed meanwhile), its queue left."""
    lock = locks.lock("closing")
    hub = hub_of(locks)
    flight = _InFlight(lock._kind, monkeypatch)
    task = asyncio.create_task(lock.acquire(timeout=10))
    await eventually(lambda: flight.sent == 1, what="the attempt to run")
    assert await lock.locked()  # granted in Redis, the reply not arrived
    locks.stop_acquiring()
    assert hub._lazy == {} and queue_sizes(locks) == (1, 1)
    (head,) = hub._queues[lock._keys.channel].waiters
    assert head.pending  # woken, as a waiter made at the start was
    flight.let_go.set()
    with pytest.raises(aiolock.ManagerNotOpenError):
        await within(task, what="the attempt to land")
    assert queue_sizes(locks) == (0, 0) and hub.admission.taken == 0 and hub._lazy == {}
    assert not await lock.locked()
    assert counts(locks) == (0, 0, 0)


#: Python functions of the engine, the kinds and the handles (aiolock's own files, not the
#: command layer in aiolock/_redis) that one uncontended cycle may enter: a bound that
#: keeps the fast path's work per cycle from creeping back (issue 21, target 2; 57 before
#: the second round of that target, which took the kinds' channel, the closures of the
#: reply decoding and the lock's unused release id off the path; 49 before a final release
#: without a successor stopped asking for the hand-over streak; 48 before the lock handle
#: set its own fields and checked its arguments inline, the lock kind kept its lease's ms,
#: a final release unparked in registry.remove, and the fast path's queue entry became
#: lazy: no Waiter, ChannelQueue, leave or _forget per cycle; 39 before a freed lock's
#: streak and wake became one call of the hub, WaiterHub.released).
CYCLE_CALLS = 39


async def _profiled_cycle(locks: aiolock.LockManager, profiler: Any) -> None:
    """One uncontended acquire and release under *profiler* (``sys.setprofile``), after
    one unprofiled cycle that warms up (the task's owner known, scripts loaded, a
    connection kept); both on the fast path."""

    async def cycle() -> None:
        lock = locks.lock("counted")
        assert await lock.try_acquire(timeout=5)
        await lock.release()

    await cycle()
    sys.setprofile(profiler)
    try:
        await cycle()
    finally:
        sys.setprofile(None)
    assert counts(locks) == (2, 2, 2)


async def test_an_uncontended_cycle_enters_few_python_functions(
    locks: aiolock.LockManager,
) -> None:
    """Counted, not timed: the functions a cycle enters, each frame once (a coroutine
    resumed after a reply counts once however many reads its reply took), in this task
    only (not the manager's background tasks), outside the command layer."""
    package = os.path.dirname(aiolock.__file__)
    outside = (os.path.join(package, "_redis") + os.sep,)
    me = asyncio.current_task()
    frames: list[FrameType] = []  # kept alive, so no id is reused within the count
    seen: set[int] = set()

    def count(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or id(frame) in seen:
            return
        name = frame.f_code.co_filename
        if (
            name.startswith(package)
            and not name.startswith(outside)
            and asyncio.current_task() is me
        ):
            seen.add(id(frame))
            frames.append(frame)

    await _profiled_cycle(locks, count)
    entered = sorted(f"{f.f_code.co_filename[len(package) :]}:{f.f_code.co_name}" for f in frames)
    assert len(frames) <= CYCLE_CALLS, entered


async def test_an_uncontended_cycle_never_searches_for_the_running_loop(
    locks: aiolock.LockManager,
) -> None:
    """Counted, not timed: aiolock's code asks the manager's loop for the current task and
    the client's loop for its futures, never ``asyncio.get_running_loop()`` (on Python
    3.10 and 3.11 a getpid() system call each: 5 per cycle before, issue 21)."""
    package = os.path.dirname(aiolock.__file__)
    me = asyncio.current_task()
    searches: list[str] = []

    def ours(frame: FrameType | None) -> bool:
        return frame is not None and frame.f_code.co_filename.startswith(package)

    def count(frame: FrameType, event: str, arg: object) -> None:
        searched = (  # directly, or through asyncio.current_task() without a loop
            event == "c_call"
            and getattr(arg, "__name__", None) in ("get_running_loop", "_get_running_loop")
            and ours(frame)
        ) or (
            event == "call"
            and frame.f_code.co_name == "current_task"
            and frame.f_locals.get("loop") is None
            and ours(frame.f_back)
        )
        if searched and asyncio.current_task() is me:
            caller = frame if event == "c_call" else frame.f_back
            assert caller is not None
            searches.append(f"{caller.f_code.co_filename[len(package) :]}:{caller.f_code.co_name}")

    await _profiled_cycle(locks, count)
    assert searches == []
