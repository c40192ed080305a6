"""The hub's progress rules, one test each on a hub alone (a subscription source that
does no I/O, no Redis), then a release of many locks, which wakes their waiters a few at
a time (issue 24), through a manager.

The turns themselves are :mod:`aiolock._engine.admission`'s (tests/unit/_engine/
test_admission.py).

Each woken head's attempt waited for a pipeline slot behind every other woken head's: at
20,000 names, 15,000 attempts were queued at once, long enough for CPython's cyclic GC
to move them to its oldest generation, whose full collections walk every waiter. The hub
now wakes at most ``Admission.WAKES`` waiters at once; the next wakes as one of them
sleeps again or leaves. These tests count attempts in flight; none is a timing.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.hub import MAX_LOCAL_STREAK, WaiterHub
from aiolock._engine.kind import Hold
from aiolock._engine.waiter import Waiter
from aiolock._redis.pubsub import SubscriptionEvents, Tally
from tests._support.helpers import eventually

N = 24
TURNS = 4
ACQUIRE = "_kinds/lock/acquire"


class _Source:
    """A source of subscriptions that does no I/O: it records what the hub wants."""

    def __init__(self) -> None:
        self.tally = Tally()
        self.wanted: set[str] = set()

    def bind(self, events: SubscriptionEvents) -> None:
        pass

    def want(self, channel: str) -> None:
        self.wanted.add(channel)

    def unwant(self, channel: str) -> None:
        self.wanted.discard(channel)

    def subscribed(self, channel: str) -> bool:
        return channel in self.wanted

    def listening(self, channel: str) -> bool:
        return channel in self.wanted

    async def run(self) -> None:
        pass


def _hub() -> WaiterHub:
    return WaiterHub(_Source(), "us")


def _hold() -> Hold:
    return cast(Hold, object())  # (the hub hands it on, and reads nothing of it)


def _woken(*waiters: Waiter) -> list[bool]:
    return [w.pending for w in waiters]


async def test_a_release_nobody_else_heard_wakes_the_head_at_once() -> None:
    """released(heard=False): the head (only) tries at once; the streak ends."""
    hub = _hub()
    head, second = hub.join("c", "owner:1", None), hub.join("c", "owner:2", None)
    hub.handed_over("c")
    hub.released("c", queued=False, heard=False)
    assert _woken(head, second) == [True, False]
    assert hub.streak("c") == 0
    hub.released("nobody", queued=False, heard=False)  # no queue: nothing to wake
    assert hub.idle("nobody")


async def test_a_release_others_heard_yields_the_lock_to_them() -> None:
    """released(heard=True): this manager's tasks keep off the lock (idle() is false, the
    head is not woken) until another client's release message, or the window's end,
    wakes the head."""
    hub = _hub()
    hub.released("c", queued=False, heard=True)
    assert not hub.idle("c") and hub.yielding("c") > 0  # (the fast path keeps off too)
    head = hub.join("c", "owner:1", None)
    assert _woken(head) == [False]
    hub.on_message("c", "us")  # our own release: it ends no yield
    assert hub.yielding("c") > 0 and _woken(head) == [False]
    hub.on_message("c", "them")  # they had their turn
    assert hub.yielding("c") == 0 and _woken(head) == [True]
    other = hub.join("d", "owner:2", None)
    hub.released("d", queued=False, heard=True)
    assert _woken(other) == [False]
    await eventually(lambda: other.pending, what="the window's end wakes the head")
    assert hub.idle("c") is False  # (its waiter is still there)
    assert hub.yielding("d") == 0


async def test_a_queued_kinds_release_wakes_no_local_waiter() -> None:
    """released(queued=True): Redis granted its next waiter, whose message wakes it."""
    hub = _hub()
    first = hub.join("f", "owner:1", None, "owner:1:1", queued=True)
    second = hub.join("f", "owner:2", None, "owner:2:1", queued=True)
    hub.released("f", queued=True, heard=False)
    assert _woken(first, second) == [False, False]
    hub.on_message("f", "owner:2:1")  # the grant names its waiter
    assert _woken(first, second) == [False, True]


async def test_at_most_max_local_streak_hand_overs_in_a_row_go_freely() -> None:
    """hand_over_freely: true for the first MAX_LOCAL_STREAK hand-overs in a row within
    this manager, then false until the lock is freed."""
    hub = _hub()
    for _ in range(MAX_LOCAL_STREAK):
        assert hub.hand_over_freely("c")
        hub.handed_over("c")
    assert not hub.hand_over_freely("c")
    assert hub.hand_over_freely("other")  # per lock
    hub.released("c", queued=False, heard=False)
    assert hub.hand_over_freely("c")


async def test_a_release_reserves_only_a_head_that_may_take_the_lock() -> None:
    """reserve_successor: the head of the queue, reserved; not while a hand-over to it is
    in flight, nor one whose grants replicas must acknowledge, nor in a queued kind's
    queue, nor once the hub closed; a fast path's entry is made into its waiter."""
    hub = _hub()
    assert hub.reserve_successor("c") is None  # nobody waits
    head = hub.join("c", "owner:1", None)
    hub.join("c", "owner:2", None)
    assert hub.reserve_successor("c") is head and head.reserved
    assert hub.reserve_successor("c") is None  # in flight: not the next one either
    head.unreserve()
    assert hub.reserve_successor("c") is head
    hub.join("a", "owner:3", None, acknowledged=True)
    assert hub.reserve_successor("a") is None
    hub.join("f", "owner:4", None, "owner:4:1", queued=True)
    assert hub.reserve_successor("f") is None
    entry = hub.enter("e", "owner:5", None, queued=False, anonymous=False)
    assert entry is not None
    made = hub.reserve_successor("e")
    assert made is not None and made.reserved and made.turn
    assert hub.materialize("e", entry) is made
    hub.join("z", "owner:6", None)
    hub.close()
    assert hub.reserve_successor("z") is None


async def test_a_hand_over_is_delivered_only_to_a_waiter_still_there() -> None:
    """deliver: the waiter gets the hold and is woken to take it; one that left (or any,
    once the hub closed) never sees it: the releaser passes it on."""
    hub = _hub()
    head = hub.join("c", "owner:1", None)
    assert hub.reserve_successor("c") is head
    head.unreserve()
    hold = _hold()
    assert hub.deliver(head, hold)
    assert head.handed is hold and head.pending and not head.reserved
    assert head.take_handed() is hold and head.handed is None
    gone = hub.join("d", "owner:2", None)
    hub.leave(gone, acquired=False)
    assert not hub.deliver(gone, _hold()) and gone.handed is None
    late = hub.join("e", "owner:3", None)
    hub.close()
    assert not hub.deliver(late, _hold()) and late.handed is None


async def test_a_lock_that_may_be_free_wakes_its_head_only() -> None:
    """wake (a local loss, a release the hub does not hear): the head tries, not the rest;
    a fast attempt in flight keeps the wake for its wait (its waiter is made)."""
    hub = _hub()
    head, second = hub.join("c", "owner:1", None), hub.join("c", "owner:2", None)
    hub.wake("c")
    assert _woken(head, second) == [True, False]
    entry = hub.enter("e", "owner:3", None, queued=False, anonymous=False)
    assert entry is not None
    hub.wake("e")
    assert hub.materialize("e", entry).pending


async def test_a_head_that_leaves_without_the_lock_wakes_the_next() -> None:
    """leave: a head (or a woken waiter) that gives up wakes the next; one that got the
    lock does not (its release will), nor one reserved (its releaser passes it on)."""
    hub = _hub()
    a, b, c = (hub.join("c", f"owner:{i}", None) for i in range(3))
    hub.leave(a, acquired=True)
    assert _woken(b, c) == [False, False]
    assert hub.reserve_successor("c") is b
    hub.leave(b, acquired=False)
    assert _woken(c) == [False]
    d = hub.join("c", "owner:3", None)
    hub.leave(c, acquired=False)
    assert _woken(d) == [True]
    assert d.left is False and c.left is True


class _HeldAttempts:
    """Holds every acquire script call of *locks*' client until :attr:`let_go` is set,
    counting how many are in flight at once (:attr:`in_flight`, :attr:`peak`)."""

    def __init__(self, locks: aiolock.LockManager, monkeypatch: pytest.MonkeyPatch) -> None:
        self.let_go = asyncio.Event()
        self.in_flight = self.peak = 0
        client: Any = locks._client
        self._original = client.run
        monkeypatch.setattr(client, "run", self._counted)

    async def _counted(self, script: Any, keys: Any, args: Any) -> Any:
        if script.name != ACQUIRE:
            return await self._original(script, keys, args)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await self.let_go.wait()
            return await self._original(script, keys, args)
        finally:
            self.in_flight -= 1


async def _held_by_another(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch, stem: str, lease: float
) -> tuple[aiolock.LockManager, list[aiolock.Lock], aiolock.LockManager, WaiterHub]:
    """A holder manager holding N locks named *stem* 0..N-1 (*lease*, renewed), and an
    open waiting manager whose hub wakes at most TURNS at once: (holder, its locks,
    the waiting manager, its hub)."""
    holder = aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix, lease=lease)
    locks = aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix)
    await holder.open()
    await locks.open()
    engine = locks._engine
    assert engine is not None
    monkeypatch.setattr(engine.hub.admission, "WAKES", TURNS)
    held = [holder.lock(f"{stem}{i}") for i in range(N)]
    for lock in held:
        await lock.acquire()
    return holder, held, locks, engine.hub


async def _herd(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch, cancel: int | None
) -> tuple[int, int, aiolock.LockManager]:
    """N waiters in one manager, one per name held by another; the holder releases all.

    Every attempt of the waiting manager is held back until the hub has heard every
    release, so that all the wakes have happened while the first attempts are still in
    flight. Returns the most attempts in flight at once and how many waiters held.
    *cancel*: the waiter (by name index) cancelled once every release was heard.
    """
    holder, held, locks, hub = await _held_by_another(redis_url, prefix, monkeypatch, "herd", 30)
    got = 0

    async def waiter(i: int) -> None:
        nonlocal got
        async with locks.lock(f"herd{i}", timeout=60):
            got += 1

    tasks = [asyncio.create_task(waiter(i)) for i in range(N)]

    def asleep() -> bool:  # every head sleeps after a busy attempt, subscribed
        waiters = [w for q in hub._queues.values() for w in q.waiters]
        return len(waiters) == N and all(
            w._future is not None and not w._future.done() for w in waiters
        )

    await eventually(
        lambda: locks.statistics().hub.subscriptions == N and asleep(), what="all asleep"
    )
    attempts = _HeldAttempts(locks, monkeypatch)
    try:
        for lock in held:
            await lock.release()
        await eventually(lambda: locks.statistics().hub.messages == N, what="all heard")
        if cancel is not None:
            tasks[cancel].cancel()
        attempts.let_go.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        for i, result in enumerate(results):
            if i == cancel:
                assert isinstance(result, asyncio.CancelledError)
            else:
                assert result is None, result
        await eventually(lambda: locks.statistics().hub.waiters == 0, what="the hub empty")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await holder.aclose()
        await holder.redis.aclose()
    return attempts.peak, got, locks


async def test_a_release_of_many_locks_wakes_their_waiters_a_few_at_a_time(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N heads woken by N release messages: never more than WAKES attempts in flight
    (before: all N at once), and every waiter holds in the end (no wake is lost)."""
    peak, got, locks = await _herd(redis_url, prefix, monkeypatch, None)
    try:
        assert peak <= TURNS, peak
        assert got == N
        hub = locks._engine.hub  # type: ignore[union-attr]
        assert hub.admission.taken == 0
    finally:
        await locks.aclose()
        await locks.redis.aclose()


async def test_a_waiter_cancelled_while_its_wake_waits_for_a_turn_loses_no_other(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last waiter woken (its wake waits behind WAKES others) is cancelled: it
    leaves the line, and every other waiter is still woken and holds."""
    peak, got, locks = await _herd(redis_url, prefix, monkeypatch, N - 1)
    try:
        assert peak <= TURNS, peak
        assert got == N - 1
        hub = locks._engine.hub  # type: ignore[union-attr]
        assert hub.admission.taken == 0
    finally:
        await locks.aclose()
        await locks.redis.aclose()


async def test_heads_whose_timers_run_out_together_probe_a_few_at_a_time(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N quiet heads on N renewed locks taken together: their timers run out together
    (the holder's lease would end), and each probes in a turn: never more than WAKES
    probes in flight (before: all N at once, queued in the client's pipeline)."""
    # Renewed by the holder's watchdog: a live holder.
    holder, held, locks, hub = await _held_by_another(redis_url, prefix, monkeypatch, "quiet", 2.0)
    kind: Any = locks.lock("quiet0")._kind
    original = kind.still_held
    let_go = asyncio.Event()
    in_flight = peak = probes = 0

    async def counted(keys: Any) -> Any:
        nonlocal in_flight, peak, probes
        probes += 1
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await let_go.wait()
            return await original(keys)
        finally:
            in_flight -= 1

    monkeypatch.setattr(kind, "still_held", counted)

    async def waiter(i: int) -> None:
        async with locks.lock(f"quiet{i}", timeout=60):
            pass

    tasks = [asyncio.create_task(waiter(i)) for i in range(N)]
    try:

        def each_head_probing_or_in_line() -> bool:
            waiters = [w for q in hub._queues.values() for w in q.waiters]
            return len(waiters) == N and in_flight + sum(w.deferred for w in waiters) == N

        # Every head's timer has run out (the probes in flight are held back meanwhile).
        await eventually(each_head_probing_or_in_line, what="every head probing or in line")
        let_go.set()
        # The line moves on: looks of the next lease end come, still a few at a time.
        await eventually(lambda: probes >= N + TURNS, what="looks after the first round")
        assert peak <= TURNS, peak
        for lock in held:
            await lock.release()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        assert all(result is None for result in results), results
        await eventually(lambda: hub.admission.taken == 0, what="every turn ended")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await holder.aclose()
        await holder.redis.aclose()
        await locks.aclose()
        await locks.redis.aclose()


async def test_a_burst_of_new_acquisitions_attempts_a_few_at_a_time(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N tasks ask for N free locks at once: their first attempts (the fast path's) go
    at most WAKES at a time, the rest wait in line (before: all N queued in the client's
    pipeline at once); every task holds in the end."""
    locks = aiolock.LockManager(Redis.from_url(redis_url), prefix=prefix)
    await locks.open()
    engine = locks._engine
    assert engine is not None
    hub = engine.hub
    monkeypatch.setattr(hub.admission, "WAKES", TURNS)
    attempts = _HeldAttempts(locks, monkeypatch)
    got = 0

    async def taker(i: int) -> None:
        nonlocal got
        async with locks.lock(f"burst{i}", timeout=60):
            got += 1

    tasks = [asyncio.create_task(taker(i)) for i in range(N)]
    try:

        def each_attempting_or_in_line() -> bool:
            # (the fast path's entries in flight are counted, not queued: WaiterHub.enter)
            waiters = [w for q in hub._queues.values() for w in q.waiters]
            return (
                locks.statistics().hub.waiters == N
                and attempts.in_flight + sum(w.deferred for w in waiters) == N
            )

        await eventually(each_attempting_or_in_line, what="every task attempting or in line")
        attempts.let_go.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        assert all(result is None for result in results), results
        assert attempts.peak <= TURNS, attempts.peak
        assert got == N
        assert hub.admission.taken == 0
        assert engine.fast_acquired == N  # the fast path, in turns
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await locks.aclose()
        await locks.redis.aclose()
