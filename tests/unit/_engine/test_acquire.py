"""Quiet waits (issue 24, item 2): a waiter on a renewed lock does not keep attempting.

The head of a queue used to run a full attempt each time the holder's lease would have
ended: N attempts per lease period for N waited-on names, although a healthy
subscription misses no release. Now, while its subscription is confirmed and the
pub/sub connection has not dropped since its last attempt, the head only probes the
key's PTTL when the lease would end; a dead holder's key is gone by then, and the head
attempts at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.kind import Attempt, Busy, Granted, LockKind
from aiolock._engine.wait import READY_WAIT
from aiolock._keys import LockKeys

# 1 s: a holder's renewal a few tenths of a second late on a loaded machine must not let
# its key lapse, which would turn a quiet probe into an attempt
LEASE = 1.0
NAMES = 3


class Counted:
    """Counts a kind's attempts and probes per lock name (wraps the kind's methods)."""

    def __init__(self, kind: LockKind) -> None:
        self.attempts: Counter[str] = Counter()
        self.probes: Counter[str] = Counter()
        self.probed = asyncio.Event()
        #: set at every attempt and probe (see until())
        self.changed = asyncio.Event()
        self._attempt: Callable[[Attempt], Awaitable[Granted | Busy]] = kind.attempt
        self._still_held: Callable[[LockKeys], Awaitable[float | None]] | None = getattr(
            kind, "still_held", None
        )
        kind.attempt = self.attempt  # type: ignore[method-assign]
        kind.still_held = self.still_held  # type: ignore[method-assign]

    async def until(self, done: Callable[[], bool], timeout: float) -> None:
        """Wait until *done()*, re-checked at each attempt or probe (bounded)."""
        deadline = time.monotonic() + timeout
        while not done():
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), max(deadline - time.monotonic(), 0))

    async def attempt(self, attempt: Attempt) -> Granted | Busy:
        self.attempts[attempt.keys.name] += 1
        self.changed.set()
        return await self._attempt(attempt)

    async def still_held(self, keys: LockKeys) -> float | None:
        self.probes[keys.name] += 1
        self.changed.set()
        if len(self.probes) == NAMES and min(self.probes.values()) >= 3:
            self.probed.set()
        assert self._still_held is not None
        return await self._still_held(keys)


def _kind(lock: aiolock.Lock) -> Any:
    return lock._kind


async def _take(lock: aiolock.Lock) -> None:
    async with lock:  # acquired and released by this task, which owns the hold
        pass


async def test_heads_waiting_on_renewed_locks_probe_instead_of_attempting(
    redis: Redis, prefix: str
) -> None:
    async with (
        aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as holder,
        aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as waiter,
    ):
        names = [f"busy-{i}" for i in range(NAMES)]
        held = [holder.lock(name) for name in names]
        for lock in held:
            await lock.acquire()  # renewed every LEASE / 3 by the holder's watchdog
        counted = Counted(_kind(waiter.lock(names[0])))
        tasks = [asyncio.create_task(_take(waiter.lock(name))) for name in names]
        try:
            # Three ends of the holder's lease per head: each probed, none attempted.
            await asyncio.wait_for(counted.probed.wait(), timeout=30 * LEASE)
            for name in names:
                # The first attempt, and the one after the subscription was confirmed.
                assert counted.attempts[name] == 2, counted.attempts
            assert not any(task.done() for task in tasks)
            # A release still wakes its waiter at once.
            await held[0].release()
            await asyncio.wait_for(tasks[0], timeout=10.0)
            assert counted.attempts[names[0]] == 3
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_holder_that_stops_renewing_frees_the_lock_for_a_quiet_head(
    redis: Redis, admin: Redis, prefix: str
) -> None:
    """A dead holder publishes nothing: its lease ends, and the probe sees the key gone."""
    async with aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as locks:
        lock = locks.lock("dead-holder", timeout=30.0)
        # A holder of another process, in the lock's own format, renewed by hand.
        await admin.set(lock.key, "elsewhere:1|1|5|5|", px=int(LEASE * 1000))
        counted = Counted(_kind(lock))
        task = asyncio.create_task(_take(lock))
        renewals = 0
        deadline = time.monotonic() + 30 * LEASE
        while renewals < 3 and time.monotonic() < deadline:  # alive for three renewals
            await asyncio.sleep(LEASE / 3)
            await admin.pexpire(lock.key, int(LEASE * 1000))
            renewals += 1
        died_at = time.monotonic()  # no renewal, no release, no message from here on
        await asyncio.wait_for(task, timeout=10.0)
        # Taken when the key's last lease ended (generous: a shared, loaded machine).
        assert time.monotonic() - died_at < LEASE + 3.0
        assert counted.attempts["dead-holder"] >= 2


async def test_after_a_pubsub_connection_loss_the_head_attempts_again(
    redis: Redis, admin: Redis, prefix: str
) -> None:
    """Releases may have been missed while the subscription was down: no quiet probe
    until an attempt made with the subscription confirmed again."""
    async with (
        aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as holder,
        aiolock.LockManager(redis, prefix=prefix, lease=LEASE) as waiter,
    ):
        held = holder.lock("cut")
        await held.acquire()
        counted = Counted(_kind(waiter.lock("cut")))
        task = asyncio.create_task(_take(waiter.lock("cut")))
        try:
            await counted.until(lambda: counted.probes["cut"] >= 1, 30 * LEASE)
            assert counted.probes["cut"] >= 1 and counted.attempts["cut"] == 2
            hub = waiter._engine.hub  # type: ignore[union-attr]
            losses = hub.losses
            await admin.client_kill_filter(_type="pubsub")
            await counted.until(lambda: counted.attempts["cut"] >= 3, 30 * LEASE)
            assert hub.losses > losses
            assert counted.attempts["cut"] >= 3  # attempted, not only probed
            assert not task.done()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await held.release()


async def test_a_head_whose_subscribe_is_out_waits_for_its_confirmation(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not confirmed within READY_WAIT, but SUBSCRIBE is out on the live connection: the
    head waits for the confirmation (which wakes it, or the connection's loss would),
    instead of attempting every READY_WAIT until it comes (issue 24: at 50,000 new
    waiters the confirmations took seconds, one more attempt per waiter each second)."""
    async with (
        aiolock.LockManager(redis, prefix=prefix, lease=30) as holder,
        aiolock.LockManager(redis, prefix=prefix, lease=30) as waiter,
    ):
        held = holder.lock("slow-confirm")
        await held.acquire()  # a 30 s lease: no lease end in this test
        hub = waiter._engine.hub  # type: ignore[union-attr]
        confirm = hub.on_confirmed
        held_back: list[str] = []
        monkeypatch.setattr(hub, "on_confirmed", held_back.append)
        counted = Counted(_kind(waiter.lock("slow-confirm")))
        task = asyncio.create_task(_take(waiter.lock("slow-confirm")))
        try:
            deadline = time.monotonic() + 30
            while not held_back:  # the server confirmed the SUBSCRIBE; the hub not yet
                assert time.monotonic() < deadline, "no SUBSCRIBE confirmation arrived"
                await asyncio.sleep(0.02)
            # (1 attempt so far, or 2 if the SUBSCRIBE went out after a READY_WAIT)
            before = counted.attempts["slow-confirm"]
            await asyncio.sleep(3 * READY_WAIT)  # three READY_WAITs pass unconfirmed
            assert counted.attempts["slow-confirm"] == before, counted.attempts  # old: +3
            monkeypatch.undo()
            for channel in held_back:
                confirm(channel)  # the confirmation wakes the head: one attempt
            await counted.until(lambda: counted.attempts["slow-confirm"] > before, 10.0)
            assert counted.attempts["slow-confirm"] == before + 1
            assert not task.done()
            await held.release()  # and a release still wakes it
            await asyncio.wait_for(task, timeout=10.0)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
