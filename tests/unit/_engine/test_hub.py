"""A release of many locks wakes their waiters a few at a time (issue 24).

Each woken head's attempt waited for a pipeline slot behind every other woken head's: at
20,000 names, 15,000 attempts were queued at once, long enough for CPython's cyclic GC
to move them to its oldest generation, whose full collections walk every waiter. The hub
now wakes at most ``WaiterHub.WAKES`` waiters at once; the next wakes as one of them
sleeps again or leaves. These tests count attempts in flight; none is a timing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.hub import WaiterHub
from tests._support.helpers import eventually

N = 24
TURNS = 4
ACQUIRE = "_kinds/lock/acquire"


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
    monkeypatch.setattr(engine.hub, "WAKES", TURNS, raising=False)
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
        assert hub._turns == 0
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
        assert hub._turns == 0
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
        await eventually(lambda: hub._turns == 0, what="every turn ended")
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
    monkeypatch.setattr(hub, "WAKES", TURNS, raising=False)
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
        assert hub._turns == 0
        assert engine.fast_acquired == N  # the fast path, in turns
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await locks.aclose()
        await locks.redis.aclose()
