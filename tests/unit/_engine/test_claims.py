"""Unit tests of :mod:`aiolock._engine.claims`.

Checks :class:`WaiterClaims`' bookkeeping (``add``, ``discard``, ``count``, per kind and
lock), its ``keep()`` loop (sorted batches of at most ``CLAIM_BATCH`` fields, every
``claim_ttl / 3`` of the shortest kind, going on past a failed refresh, and really
moving the claims' expiry in Redis), and, through a LockManager, that a waiting
fair-lock task is counted while it waits and withdrawn from Redis when it gives up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import anyio
import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.claims import CLAIM_BATCH, WaiterClaims
from aiolock._engine.kind import Attempt, Busy, Granted, LockKind
from aiolock._engine.runtime import Runtime
from aiolock._errors import LockConnectionError
from aiolock._keys import KeySpace, LockKeys, new_manager_id
from aiolock._kinds.fair.kind import FairLockKind, claims_key
from aiolock._redis.client import Client


class RecordingFairKind(FairLockKind):
    """A real fair lock kind that records each refresh (and still sends it to Redis),
    failing those of the names in *failing* with a connection error."""

    def __init__(
        self, runtime: Runtime, claim_ttl: float, failing: frozenset[str] = frozenset()
    ) -> None:
        super().__init__(runtime, claim_ttl)
        self.calls: list[tuple[str, list[str]]] = []
        self.failing = failing
        self.called = asyncio.Event()

    async def refresh_claims(self, keys: LockKeys, fields: Sequence[str]) -> None:
        self.calls.append((keys.name, list(fields)))
        self.called.set()
        if keys.name in self.failing:
            raise LockConnectionError("Redis went away (on purpose)")
        await super().refresh_claims(keys, fields)

    def of(self, name: str) -> list[list[str]]:
        """The batches sent for the lock *name*, in order."""
        return [fields for called, fields in self.calls if called == name]

    async def wait_for(self, name: str, calls: int) -> None:
        """Until *name* has been refreshed *calls* times (bounded by the caller)."""
        while len(self.of(name)) < calls:
            self.called.clear()
            await self.called.wait()


@pytest.fixture
async def runtime(redis: Redis, prefix: str) -> AsyncIterator[Runtime]:
    client = Client(redis)
    try:
        yield Runtime(client, KeySpace(prefix, new_manager_id()), lease=30.0, fence_ttl=60.0)
    finally:
        await client.aclose()


def keeping(claims: WaiterClaims) -> asyncio.Task[None]:
    return asyncio.create_task(claims.keep(), name="keep claims")


async def stop(task: asyncio.Task[None]) -> None:
    assert not task.done(), "keep() ended by itself"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_add_discard_and_count_per_kind_and_lock(runtime: Runtime, prefix: str) -> None:
    claims = WaiterClaims()
    fair, other = FairLockKind(runtime), FairLockKind(runtime)
    a, b = LockKeys(prefix, "a", "fair"), LockKeys(prefix, "b", "fair")
    assert claims.count == 0
    claims.add(fair, a, "w1")
    claims.add(fair, a, "w2")
    claims.add(fair, a, "w2")  # the same field again: one registration
    claims.add(fair, b, "w1")  # the same field of another lock: its own
    claims.add(other, a, "w1")  # the same lock of another kind: its own
    assert claims.count == 4
    # Discarding what is not there changes nothing.
    claims.discard(fair, a, "nobody")
    claims.discard(fair, LockKeys(prefix, "c", "fair"), "w1")
    assert claims.count == 4
    # Entries are found by the lock's key, whichever LockKeys object names it.
    claims.discard(fair, LockKeys(prefix, "a", "fair"), "w2")
    assert claims.count == 3
    assert (fair, a.lock) in claims._fields
    claims.discard(fair, a, "w1")  # its last field: the lock's entry goes
    assert (fair, a.lock) not in claims._fields
    assert claims.count == 2
    claims.discard(fair, b, "w1")
    claims.discard(other, a, "w1")
    assert claims.count == 0
    assert claims._fields == {}


async def test_keep_refreshes_in_sorted_batches_of_claim_batch(
    runtime: Runtime, prefix: str
) -> None:
    kind = RecordingFairKind(runtime, claim_ttl=0.03)  # a refresh every 10 ms
    keys = LockKeys(prefix, "many", "fair")
    fields = [f"w{i:04d}" for i in range(CLAIM_BATCH + 7)]
    claims = WaiterClaims()
    for field in reversed(fields):
        claims.add(kind, keys, field)
    task = keeping(claims)
    with anyio.fail_after(5):
        await kind.wait_for("many", 2)
    await stop(task)
    first, second = kind.of("many")[:2]
    assert [len(first), len(second)] == [CLAIM_BATCH, 7]
    assert first + second == sorted(fields)  # one round: every field once, in order


async def test_keep_refreshes_at_the_pace_of_the_shortest_claim_ttl(
    runtime: Runtime, prefix: str
) -> None:
    slow = RecordingFairKind(runtime, claim_ttl=60.0)  # alone: a refresh every 20 s
    quick = RecordingFairKind(runtime, claim_ttl=0.03)
    claims = WaiterClaims()
    claims.add(slow, LockKeys(prefix, "slow", "fair"), "w")
    claims.add(quick, LockKeys(prefix, "quick", "fair"), "w")
    task = keeping(claims)
    # Five rounds take 50 ms; at the slow kind's pace (20 s), or even the idle pace
    # (a third of a second), they would take far longer than this bound.
    with anyio.fail_after(1.2):
        await quick.wait_for("quick", 5)
    await stop(task)
    assert len(slow.of("slow")) >= 5  # every round refreshes every kind


async def test_a_claim_of_a_shorter_lived_kind_does_not_wait_out_the_current_sleep(
    runtime: Runtime, prefix: str
) -> None:
    """keep() sleeps a third of the shortest claim lifetime it knows of; a kind with a
    shorter one, registered during that sleep, used to wait for its end (20 s here,
    with claims that lapse after 30 ms)."""
    slow = RecordingFairKind(runtime, claim_ttl=60.0)
    quick = RecordingFairKind(runtime, claim_ttl=0.03)
    claims = WaiterClaims()
    claims.add(slow, LockKeys(prefix, "slow", "fair"), "w")
    task = keeping(claims)
    await asyncio.sleep(0)  # keep() is in its 20 s sleep
    claims.add(quick, LockKeys(prefix, "quick", "fair"), "w")
    with anyio.fail_after(5):
        await quick.wait_for("quick", 3)
    await stop(task)


async def test_a_failed_refresh_is_logged_and_the_rest_go_on(
    runtime: Runtime, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    kind = RecordingFairKind(runtime, claim_ttl=0.03, failing=frozenset({"broken"}))
    claims = WaiterClaims()
    broken = [f"b{i:04d}" for i in range(CLAIM_BATCH + 1)]  # two batches
    for field in broken:
        claims.add(kind, LockKeys(prefix, "broken", "fair"), field)
    claims.add(kind, LockKeys(prefix, "fine", "fair"), "f")  # refreshed after it
    caplog.set_level(logging.WARNING, logger="aiolock")
    task = keeping(claims)
    with anyio.fail_after(5):
        await kind.wait_for("fine", 2)  # two rounds, each past the failure
    await stop(task)
    # Each round sent the failing lock's first batch only: its second is skipped.
    assert kind.of("broken")
    assert all(batch == broken[:CLAIM_BATCH] for batch in kind.of("broken"))
    assert "refreshing the waiters of 'broken' failed" in caplog.text
    assert "Redis went away (on purpose)" in caplog.text
    assert claims.count == CLAIM_BATCH + 2  # keep() never drops a registration


async def test_keep_moves_a_live_claims_expiry_forward_in_redis(
    runtime: Runtime, prefix: str, admin: Redis
) -> None:
    kind = RecordingFairKind(runtime, claim_ttl=0.3)  # a refresh every 100 ms
    keys = LockKeys(prefix, "queued", "fair")

    def attempt(owner: str) -> Attempt:
        return Attempt(keys, owner, f"{owner}:1", 0, 5.0, keys.void(f"{owner}:1"))

    assert isinstance(await kind.attempt(attempt("holder")), Granted)
    assert isinstance(await kind.attempt(attempt("waiter")), Busy)  # queued, claimed
    registered = await admin.zscore(claims_key(keys), "waiter:1")
    assert registered is not None
    claims = WaiterClaims()
    claims.add(kind, keys, "waiter:1")
    task = keeping(claims)
    with anyio.fail_after(5):
        await kind.wait_for("queued", 1)
    await stop(task)
    refreshed = await admin.zscore(claims_key(keys), "waiter:1")
    assert refreshed is not None and refreshed > registered
    assert kind.of("queued") == [["waiter:1"]]


async def test_a_waiting_fair_lock_task_is_counted_until_it_gives_up(
    locks: aiolock.LockManager,
    redis: Redis,
    prefix: str,
    admin: Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = locks._engine
    assert engine is not None
    claims = engine.state.claims
    registered = asyncio.Event()
    add = claims.add

    def recorded_add(kind: LockKind, keys: LockKeys, field: str) -> None:
        add(kind, keys, field)
        registered.set()

    monkeypatch.setattr(claims, "add", recorded_add)
    async with aiolock.LockManager(redis, prefix=prefix) as other:
        holder = other.fair_lock("f")
        await holder.acquire()
        waiter = asyncio.create_task(locks.fair_lock("f").acquire(timeout=30))
        with anyio.fail_after(5):
            await registered.wait()
        assert locks.statistics().claims == 1
        key = claims_key(LockKeys(prefix, "f", "fair"))
        (field,) = await admin.zrange(key, 0, -1)
        assert isinstance(field, bytes) and field.decode().startswith(f"{locks.id}:")
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert locks.statistics().claims == 0
        assert await admin.zscore(key, field) is None  # withdrawn at once, not expired
        assert await holder.owned()
        await holder.release()
