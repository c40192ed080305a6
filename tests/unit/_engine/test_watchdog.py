"""Renewal batches (issue 24, item 4): sized per kind, sent without waiting on each other.

A renewal script blocks Redis while it runs, so each kind names how many of its holds
one call may carry (``renew_batch``: as many as stay under a millisecond of Redis time).
These tests count the holds in every renewal call the watchdog makes.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.kind import Hold, LockKind
from aiolock._engine.watchdog import RENEW_IN_FLIGHT
from aiolock._kinds.semaphore.kind import SemaphoreKeys
from aiolock.testing import RedisServer

Maker = Callable[[aiolock.LockManager, int], Any]

#: kind name -> how to acquire its i-th hold (each on a name of its own, as at scale)
KINDS: dict[str, Maker] = {
    "lock": lambda m, i: m.lock(f"l{i}").acquire(),
    "read": lambda m, i: m.rw_lock(f"r{i}").read().acquire(),
    "semaphore": lambda m, i: m.semaphore(f"s{i}", 2).acquire(),
    "timestamp lock": lambda m, i: m.lock(f"t{i}", wire="timestamp").acquire(),
}


class Recorder:
    """Wraps a kind's ``renew``: the size of every call, and the most in flight at once."""

    def __init__(self, kind: LockKind) -> None:
        self.sizes: list[int] = []
        self.in_flight = self.most_in_flight = 0
        self._renew: Callable[[Sequence[Hold], float], Awaitable[list[bool]]] = kind.renew

    async def renew(self, holds: Sequence[Hold], lease: float) -> list[bool]:
        self.sizes.append(len(holds))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await self._renew(holds, lease)
        finally:
            self.in_flight -= 1


def _engine(locks: aiolock.LockManager) -> Any:
    engine = locks._engine
    assert engine is not None
    return engine


@pytest.mark.parametrize("kind_name", sorted(KINDS))
async def test_each_renewal_call_carries_at_most_the_kinds_batch(
    redis: Redis, prefix: str, kind_name: str
) -> None:
    async with aiolock.LockManager(redis, prefix=prefix) as locks:
        # The calls of the watchdog's round alone: not the check of each hold that a
        # manager makes when it starts listening for its lock's releases (a slow machine
        # takes more than their 0.2 s to acquire these 701 holds).
        _engine(locks).heed.after = math.inf
        await KINDS[kind_name](locks, 0)
        (hold,) = _engine(locks).registry.renewable()
        kind = hold.kind
        batch = kind.renew_batch
        assert 0 < batch <= 500
        # two full batches and one hold more: three calls, none larger than the batch
        for i in range(1, 2 * batch + 1):
            await KINDS[kind_name](locks, i)
        recorder = Recorder(kind)
        kind.renew = recorder.renew  # type: ignore[method-assign,unused-ignore]
        assert await _engine(locks).watchdog.renew_all()
        assert sorted(recorder.sizes, reverse=True) == [batch, batch, 1]
        # the round did not wait for one batch's reply before sending the next
        assert recorder.most_in_flight == min(3, RENEW_IN_FLIGHT)


async def test_the_batch_sizes_follow_the_work_per_hold(locks: aiolock.LockManager) -> None:
    """The kinds whose scripts do about 2.5-3 times a lock's work per hold (measured in
    benchmarks/NOTES.md, issue 24) send at most half as many holds per call."""
    holds = [await make(locks, 0) for make in KINDS.values()]
    batches = {hold.kind.name: hold.kind.renew_batch for hold in _engine(locks).registry}
    assert len(holds) == len(batches) == 4
    # 10,000 locks renewed in at most 100 round trips per lease period (W5), 3 rounds each
    assert 3 * -(-10_000 // batches["lock"]) < 100
    assert batches["lock"] == 350
    for name in ("read lock", "semaphore", "timestamp lock"):
        assert batches[name] <= batches["lock"] // 2, name


# -- the renew scripts' fallback: when PEXPIRE ... GT does not take -------------------


async def test_a_semaphore_renewal_keeps_the_longest_lease_and_an_extend_can_shorten(
    locks: aiolock.LockManager, admin: Redis
) -> None:
    semaphore = locks.semaphore("lifetime", 3)
    long = await semaphore.acquire(lease=30.0)  # fixed: only checked by the watchdog
    short = await semaphore.acquire(lease=5.0)
    # Renewing the short one must not cut the keys' lifetime below the long lease.
    await short.extend(2.0)
    for key in (semaphore.key, _expiry_key(semaphore)):
        assert 25_000 < await admin.pttl(key) <= 30_000
    await long.extend(1.0)  # shortened: the lifetime follows the latest lease, 2 s
    for key in (semaphore.key, _expiry_key(semaphore)):
        assert 1_000 < await admin.pttl(key) <= 2_000
    assert await _engine(locks).watchdog.renew_all()
    await long.release()
    await short.release()


async def test_a_semaphore_renewal_reports_a_replaced_holders_hash_as_lost(
    locks: aiolock.LockManager, admin: Redis
) -> None:
    semaphore = locks.semaphore("replaced", 2)
    permit = await semaphore.acquire()
    (hold,) = _engine(locks).registry.renewable()
    await admin.set(semaphore.key, "not a hash")  # no TTL: PEXPIRE GT does not take
    assert await hold.kind.renew([hold], 10.0) == [False]
    await admin.delete(semaphore.key)
    assert await hold.kind.renew([hold], 10.0) == [False]
    del permit


async def test_a_read_renewal_keeps_another_readers_longer_lease(
    locks: aiolock.LockManager, admin: Redis
) -> None:
    rw = locks.rw_lock("readers")
    long, short = rw.read(lease=30.0), rw.read(lease=5.0)

    async def read_briefly() -> None:
        async with short:
            await short.extend(2.0)
            assert 25_000 < await admin.pttl(rw.read().key) <= 30_000

    async with long:
        await asyncio.create_task(read_briefly())
        await long.extend(1.0)  # the only reader left: the lifetime follows it down
        assert 0 < await admin.pttl(rw.read().key) <= 1_000
    reader = rw.read()
    await reader.acquire()
    (hold,) = _engine(locks).registry.renewable()
    await admin.set(reader.key, "not a hash")  # no TTL: PEXPIRE GT does not take
    assert await hold.kind.renew([hold], 10.0) == [False]
    await admin.delete(reader.key)
    with pytest.raises(aiolock.LockLostError):
        await reader.release()


def _expiry_key(semaphore: aiolock.Semaphore) -> str:
    keys = semaphore._keys
    assert isinstance(keys, SemaphoreKeys)
    return keys.expiry


async def test_a_semaphore_renewal_sends_five_commands_per_one_permit_semaphore() -> None:
    """Issue 24: per renewed permit of a semaphore with one permit held, the script runs
    ZSCORE, ZADD, and one PEXPIRE each of the holders hash (GT), the expiry set and the
    limit key (GT): five commands, and one TIME per call. It ran six (the limit key took
    a PTTL and a PEXPIRE), and a Lua table per permit.

    INFO commandstats counts every client's commands, so this runs on a server of its
    own, whose manager's watchdog does not fire during the test: on the suite's shared
    server, a CI run under load once counted 6 PEXPIREs of other clients in the window."""
    n = 20
    with RedisServer() as server:
        admin = Redis.from_url(server.url)
        client = Redis.from_url(server.url)
        try:
            # (A 45 s lease: its watchdog's first round comes after 15 s, and renewing
            # to 60 s lengthens every key, so PEXPIRE GT takes.)
            manager = aiolock.LockManager(client, prefix="five", lease=45, identity=False)
            async with manager as locks:
                for i in range(n):
                    await locks.semaphore(f"five-{i}", 2).acquire()
                holds = _engine(locks).registry.renewable()
                assert len(holds) == n
                kind = holds[0].kind
                await kind.renew(holds, 60.0)  # every key has its TTL from a renewal now
                await admin.config_resetstat()
                assert await kind.renew(holds, 60.0) == [True] * n
                stats = await admin.info("commandstats")
        finally:
            await client.aclose()
            await admin.aclose()
    calls = {
        name.removeprefix("cmdstat_"): int(value["calls"])
        for name, value in stats.items()
        if name.removeprefix("cmdstat_") in ("zscore", "zadd", "pexpire", "pttl", "hexists", "time")
    }
    assert calls == {"zscore": n, "zadd": n, "pexpire": 3 * n, "time": 1}, calls
