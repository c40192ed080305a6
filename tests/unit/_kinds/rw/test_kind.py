"""What only the read-write lock promises; the contract suite (test_contract.py) covers
what every kind keeps, for both sides.

Multi-process tests run children of :mod:`tests._children.rw`, stopped by pid; "another
manager" in a test is another client as far as Redis can tell.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.kind import Busy, Granted
from aiolock._kinds.rw.kind import WriteLockKind
from tests._support.faults import Child, bounded, children
from tests._support.helpers import counting_client, eventually


class RWChild(Child):
    module = "tests._children.rw"


@pytest.fixture
async def other(redis_url: str, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as manager:
        yield manager


def spec(redis_url: str, prefix: str, **extra: Any) -> dict[str, Any]:
    return {"url": redis_url, "prefix": prefix, "name": "doc", "max_seconds": 60, **extra}


def keys(prefix: str, name: str = "doc") -> tuple[str, str, str]:
    base = f"{prefix}:rw:{{{name}}}"
    return base, f"{base}:leases", f"{base}:claims"


async def can_write(manager: aiolock.LockManager, name: str = "doc") -> bool:
    side = manager.rw_lock(name).write()
    if await side.try_acquire():
        await side.release()
        return True
    return False


async def can_read(manager: aiolock.LockManager, name: str = "doc") -> bool:
    side = manager.rw_lock(name).read()
    if await side.try_acquire():
        await side.release()
        return True
    return False


# -- single process ---------------------------------------------------------------------


async def test_a_write_hold_keeps_readers_and_writers_out(
    locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    async with locks.rw_lock("doc").write():
        assert not await can_read(other)
        assert not await can_write(other)
        waiting = asyncio.create_task(can_read_waiting(other))
        await asyncio.sleep(0.2)
        assert not waiting.done()
    assert await bounded(waiting, 5, "the waiting reader")


async def can_read_waiting(manager: aiolock.LockManager) -> bool:
    async with manager.rw_lock("doc").read(timeout=5):
        return True


async def test_both_sides_are_reentrant_and_tokens_increase(locks: aiolock.LockManager) -> None:
    rw = locks.rw_lock("doc")
    tokens: list[int] = []
    for side in (rw.write(), rw.read(), rw.write()):
        await side.acquire()
        await side.acquire()
        assert await side.hold_count() == 2
        token = side.fencing_token
        assert token is not None
        tokens.append(token)
        await side.release()
        await side.release()
        assert await side.hold_count() == 0
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


async def test_the_wire_format(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    hash_key, leases, claims = keys(prefix)
    rw = locks.rw_lock("doc")
    held = asyncio.Event()
    done = asyncio.Event()

    async def reader() -> None:
        async with rw.read():
            held.set()
            await done.wait()

    readers = [asyncio.create_task(reader()) for _ in range(2)]
    await held.wait()
    await eventually(lambda: locks.statistics().held == 2, what="two readers")
    writer = asyncio.create_task(can_read_waiting_writer(other))
    await eventually(lambda: other.statistics().claims == 1, what="the claim")
    fields = await admin.hgetall(hash_key)
    assert sorted(fields.values()) == [b"1", b"1"] and b"writer" not in fields
    assert await admin.zcard(leases) == 2 and await admin.zcard(claims) == 1
    now_ms = int((await admin.time())[0]) * 1000
    ends: Any = await admin.zrange(leases, 0, -1, withscores=True)
    for _, end in ends:
        assert now_ms + 25_000 < end < now_ms + 31_000  # each hold's own lease, server ms
    assert 0 < await admin.pttl(hash_key) <= 30_000 and await admin.pttl(claims) > 0
    assert not await can_read(locks)  # a new reader waits behind the claim
    done.set()
    await asyncio.gather(*readers)
    await bounded(writer, 5, "the writer")
    assert not await admin.exists(hash_key, leases, claims)  # nothing left but tombstones


async def can_read_waiting_writer(manager: aiolock.LockManager) -> None:
    async with manager.rw_lock("doc").write(timeout=5) as side:
        fields = await manager.redis.hgetall(keys(manager.prefix)[0])
        assert fields[b"writer"] in fields and b"writer_owner" in fields
        assert side.fencing_token is not None


async def test_extend_a_fixed_lease(locks: aiolock.LockManager, admin: Redis, prefix: str) -> None:
    side = locks.rw_lock("doc").read(lease=1)
    async with side:
        first = await side.ttl()
        assert first is not None and first <= 1
        await side.extend(20)
        (field,) = await admin.zrange(keys(prefix)[1], 0, -1)
        ttl = await side.ttl()
        assert ttl is not None and 19 < ttl <= 20
    assert field
    async with locks.rw_lock("doc").write():
        with pytest.raises(aiolock.LockError, match="renewed automatically"):
            await locks.rw_lock("doc").write().extend(1)


async def test_force_release_ends_both_sides(
    redis_url: str, prefix: str, other: aiolock.LockManager, admin: Redis
) -> None:
    # renewed 1.5 s leases: the read hold outlives a late round, so the force-release ends it
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=1.5) as short:
        rw = short.rw_lock("doc")
        entered = asyncio.Event()

        async def reader() -> None:
            async with rw.read():
                entered.set()
                await asyncio.sleep(10)

        task = asyncio.create_task(reader())
        await entered.wait()
        assert await other.rw_lock("doc").write().force_release()
        with pytest.raises(aiolock.LockLostError):
            await bounded(task, 3, "the reader's loss")
        assert not await admin.exists(*keys(prefix))
        assert await can_write(other)
        assert not await other.rw_lock("doc").read().force_release()


async def test_a_key_of_another_type_is_named(locks: aiolock.LockManager, admin: Redis) -> None:
    _, leases, _ = keys(locks.prefix)
    await admin.set(leases, "not a zset")
    with pytest.raises(aiolock.LockKeyTypeError, match="leases"):
        await locks.rw_lock("doc").read().acquire(timeout=0)
    with pytest.raises(aiolock.LockKeyTypeError, match="leases"):
        await locks.rw_lock("doc").write().acquire(timeout=0)
    assert locks.statistics().held == 0
    await admin.delete(leases)


async def test_renewal_is_batched(redis_url: str, prefix: str) -> None:
    client, trips = counting_client(redis_url)
    try:
        # A 3 s lease, renewed every second: a loaded machine that delays a round, or the
        # 33 releases at the end, by two seconds still keeps the holds (with a 1.5 s lease,
        # a CPU hog beside the suite let them run out while their releases were queued).
        async with aiolock.LockManager(client, prefix=prefix, lease=3.0) as locks:
            # The sends of the renewal rounds alone: not the check of each write hold a
            # manager makes when it starts listening for its lock's releases.
            locks._open_engine().heed.after = math.inf
            stop = asyncio.Event()
            holding = 0

            async def hold(name: str, write: bool) -> None:
                nonlocal holding
                rw = locks.rw_lock(name)
                async with rw.write() if write else rw.read():
                    holding += 1
                    await stop.wait()

            tasks = [asyncio.create_task(hold(f"r{i % 3}", False)) for i in range(30)]
            tasks += [asyncio.create_task(hold(f"w{i}", True)) for i in range(3)]
            await eventually(lambda: holding == 33, what="33 holds")
            before = locks.statistics()
            sends = trips.sends
            # two renewal rounds, the second a third of the lease after the first
            await eventually(
                lambda: locks.statistics().renewal_rounds - before.renewal_rounds >= 2,
                what="two renewal rounds",
            )
            after = locks.statistics()
            rounds = after.renewal_rounds - before.renewal_rounds
            round_trips = after.renewal_round_trips - before.renewal_round_trips
            assert round_trips <= 2 * rounds  # one batch per side, not one per hold
            # a round sends one batch per side, and the manager's identity record (one SET);
            # a few writes of background work on periods of its own (the waiters' claims,
            # every 3.3 s) may fall in the window. One batch per hold would be 33 a round.
            assert trips.sends - sends <= 3 * rounds + 4, (trips.sends - sends, rounds)
            assert after.lost == {} and after.held == 33
            stop.set()
            await asyncio.gather(*tasks)
    finally:
        await client.aclose()


# -- several processes -----------------------------------------------------------------


@pytest.mark.processes
async def test_readers_share_across_tasks_and_processes(
    redis_url: str, prefix: str, locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    rw = locks.rw_lock("doc")
    release = asyncio.Event()
    holding = 0

    async def reader() -> None:
        nonlocal holding
        async with rw.read(timeout=10):
            holding += 1
            await release.wait()

    tasks = [asyncio.create_task(reader()) for _ in range(5)]
    await eventually(lambda: holding == 5, what="five local readers")
    made = [RWChild("read", spec(redis_url, prefix, tasks=3)) for _ in range(2)]
    async with children(*made):
        for child in made:
            await child.expect("ALL ", 30)  # while the local readers still hold
        assert holding == 5
        assert not await can_write(other)
        for child in made:
            await child.send(b"go\n")
            await child.expect("DONE", 30)
    release.set()
    await asyncio.gather(*tasks)
    assert await can_write(other)


@pytest.mark.processes
async def test_writers_exclude_everyone_across_processes(
    redis_url: str, prefix: str, admin: Redis
) -> None:
    counters = f"{prefix}:check"
    made = [
        RWChild(
            "mix",
            spec(redis_url, prefix, tasks=4, ops=40, write_ratio=0.3, seed=i, counters=counters),
        )
        for i in range(3)
    ]
    async with children(*made):
        reports = [json.loads((await c.expect("REPORT ", 120))[7:]) for c in made]
    assert [r["errors"] for r in reports] == [[], [], []]
    assert sum(r["reads"] + r["writes"] for r in reports) == 3 * 4 * 40
    assert sum(r["writes"] for r in reports) > 0
    assert sum(r["overlaps"] for r in reports) == 0
    state = await admin.hgetall(counters)
    assert b"overlaps" not in state
    assert int(state[b"max_readers"]) >= 2  # readers did share


@pytest.mark.processes
async def test_a_writer_is_not_starved_by_a_stream_of_readers(
    redis_url: str, prefix: str, locks: aiolock.LockManager, admin: Redis
) -> None:
    _, leases, _ = keys(prefix)
    stream = RWChild("stream", spec(redis_url, prefix, tasks=6, hold_ms=60))
    async with children(stream):
        await stream.expect("STARTED", 30)
        await asyncio.sleep(0.3)
        for _ in range(20):  # the readers overlap: some read hold exists all the time
            assert await admin.zcard(leases) > 0
            await asyncio.sleep(0.02)
        started = time.monotonic()
        async with locks.rw_lock("doc").write(timeout=20):
            waited = time.monotonic() - started
            assert await admin.zcard(leases) == 1  # the stream waits behind this writer
            await asyncio.sleep(0.2)
            assert await admin.zcard(leases) == 1
        await stream.send(b"stop\n")
        count = int((await stream.expect("COUNT ", 30)).split()[1])
    assert count > 10
    # In once the reads in flight end (60 ms each), with room for a loaded machine; a
    # starved writer gets in only if the stream happens to leave no read held.
    assert waited < 5.0, f"the writer waited {waited:.2f} s"


@pytest.mark.processes
async def test_a_killed_waiting_writer_stops_blocking_readers_within_claim_ttl(
    redis_url: str, prefix: str, locks: aiolock.LockManager, other: aiolock.LockManager
) -> None:
    claim_ttl = 1.0
    rw = locks.rw_lock("doc")
    await rw.read().acquire()  # the child's writer waits for this reader
    child = RWChild("write_wait", spec(redis_url, prefix, claim_ttl=claim_ttl))
    async with children(child):
        await child.expect("CLAIMED", 30)
        assert not await can_read(other)  # new readers wait for the writer

        async def read() -> float:
            async with other.rw_lock("doc").read(timeout=20):
                return time.monotonic()

        reader = asyncio.create_task(read())
        await asyncio.sleep(2 * claim_ttl)
        assert not reader.done(), "the child's claim was not refreshed"
        child.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        got_at = await bounded(reader, 25, "the reader")
        assert await child.wait(10) == -signal.SIGKILL
    await rw.read().release()
    waited = got_at - killed_at
    # Within the dead writer's 1 s claim, with room for a loaded machine: not the default
    # claim lifetime (10 s), nor the reader's 20 s timeout.
    assert waited < claim_ttl + 3.0, f"the reader got in {waited:.2f} s after the kill"


@pytest.mark.processes
async def test_a_crashed_readers_hold_ends_by_its_own_lease(
    redis_url: str, prefix: str, other: aiolock.LockManager, admin: Redis
) -> None:
    lease = 1.0
    _, leases, _ = keys(prefix)
    child = RWChild("read", spec(redis_url, prefix, tasks=1, lease=lease))
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix, lease=lease) as locks:
        rw = locks.rw_lock("doc")
        await rw.read().acquire()
        mine = rw.read()._current_hold()
        assert mine is not None
        async with children(child):
            await child.expect("ALL ", 30)
            assert await admin.zcard(leases) == 2

            async def write() -> float:
                async with other.rw_lock("doc").write(timeout=20):
                    return time.monotonic()

            writer = asyncio.create_task(write())
            child.signal(signal.SIGKILL)
            await asyncio.sleep(lease + 0.6)  # the writer retries once the child's lease ends
            assert await admin.zrange(leases, 0, -1) == [mine.field.encode()]
            await asyncio.sleep(2 * lease)  # our reader is renewed all along
            assert not writer.done()
            assert locks.statistics().lost == {}
            released_at = time.monotonic()
            await rw.read().release()
            got_at = await bounded(writer, 5, "the writer")
            assert got_at - released_at < 0.5


@pytest.mark.processes
async def test_a_writers_release_wakes_the_readers_of_every_process(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    side = locks.rw_lock("doc").write()
    await side.acquire()
    made = [RWChild("read", spec(redis_url, prefix, tasks=3)) for _ in range(2)]
    async with children(*made):
        for child in made:
            await child.expect("WAITING", 30)
        released_at = time.monotonic()
        await side.release()
        held_at = [float((await child.expect("ALL ", 10)).split()[1]) for child in made]
        for child in made:
            await child.send(b"go\n")
            await child.expect("DONE", 30)
    late = max(held_at) - released_at
    assert late < 0.5, f"the last process's readers held {late:.2f} s after the release"


async def test_claim_ttl_is_the_kinds(locks: aiolock.LockManager) -> None:
    assert locks._kind(WriteLockKind).claim_ttl == 10.0


async def test_a_writer_that_gives_up_lets_the_readers_in_at_once(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    rw = locks.rw_lock("doc")
    await rw.read().acquire()
    with pytest.raises(aiolock.LockTimeoutError, match="write lock 'doc'"):
        await other.rw_lock("doc").write().acquire(timeout=0.5)
    assert not await admin.exists(keys(prefix)[2])  # the claim was withdrawn

    # A reader that waits behind a writer's claim is woken when the writer gives up.
    async def read() -> float:
        async with rw.read(timeout=5):
            return time.monotonic()

    writer = asyncio.create_task(other.rw_lock("doc").write().acquire(timeout=1.0))
    await eventually(lambda: other.statistics().claims == 1, what="the claim")
    reader = asyncio.create_task(read())
    with pytest.raises(aiolock.LockTimeoutError):
        await writer
    gave_up_at = time.monotonic()
    got_at = await bounded(reader, 5, "the reader")
    assert got_at - gave_up_at < 0.5
    await rw.read().release()
    assert other.statistics().timeouts == {"write lock": 2}


# -- regressions found in review ----------------------------------------------------------


async def test_a_late_undo_of_a_writers_earlier_attempt_leaves_its_hold_alone(
    locks: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    # A waiting writer makes every attempt of its wait under one field (its claim's). If
    # an attempt fails on a connection error, its undo may be retried in the background
    # after the writer's next attempt was granted: that undo must not drop the new hold.
    # The script calls are made here in that order, as the engine would make them.
    engine = locks._open_engine()
    kind = locks._kind(WriteLockKind)
    lock_keys = locks._keyspace.keys("doc", "rw")
    reader = locks.rw_lock("doc").read()
    held, leave = asyncio.Event(), asyncio.Event()

    async def read() -> None:
        async with reader:
            held.set()
            await leave.wait()

    task = asyncio.create_task(read())
    await held.wait()
    field = "writer-task:1"
    first = engine.acquiring.new_attempt(lock_keys, "writer-task", field, 30.0, 1)
    second = engine.acquiring.new_attempt(lock_keys, "writer-task", field, 30.0, 1)
    assert isinstance(await kind.attempt(first), Busy)  # its reply was lost
    leave.set()
    await task
    assert isinstance(await kind.attempt(second), Granted)  # the writer now holds
    assert not await kind.undo(first)  # the first attempt's undo, retried late
    hash_key = keys(prefix)[0]
    assert await admin.hget(hash_key, field) == b"1"
    assert not await can_read(locks) and not await can_write(locks)
    # The hold's own attempt still undoes it (an attempt cancelled in flight).
    assert await kind.undo(second)
    assert await admin.exists(hash_key) == 0


async def test_a_late_undo_of_a_granted_attempt_leaves_the_retry_that_took_it_over(
    locks: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    # The first attempt was granted but its reply lost; the writer's retry finds the
    # hold under its field and takes it over: the first attempt's late undo must not
    # drop it.
    engine = locks._open_engine()
    kind = locks._kind(WriteLockKind)
    lock_keys = locks._keyspace.keys("doc", "rw")
    field = "writer-task:1"
    first = engine.acquiring.new_attempt(lock_keys, "writer-task", field, 30.0, 1)
    second = engine.acquiring.new_attempt(lock_keys, "writer-task", field, 30.0, 1)
    assert isinstance(await kind.attempt(first), Granted)  # reply lost
    assert isinstance(await kind.attempt(second), Granted)  # the retry takes it over
    assert not await kind.undo(first)
    assert await admin.hget(keys(prefix)[0], field) == b"1"
    assert not await can_read(locks)


async def test_churn_with_timeouts_cancellations_and_downgrades(
    locks: aiolock.LockManager, other: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    """Two managers, readers and writers with short timeouts, cancellations in flight and
    downgrades: an independent checker sees many readers or one writer, never both, and
    nothing is left in Redis or in either manager afterwards."""
    readers = writers = 0
    broken: list[str] = []
    done = {"read": 0, "write": 0, "gave up": 0}

    async def inside(kind: str, rng: random.Random) -> None:
        nonlocal readers, writers
        if kind == "read":
            readers += 1
            if writers:
                broken.append("a reader next to a writer")
        else:
            writers += 1
            if writers > 1 or readers:
                broken.append(f"a writer next to {readers} readers and {writers - 1} writers")
        await asyncio.sleep(rng.choice((0, 0.001, 0.003)))
        if kind == "read":
            readers -= 1
        else:
            writers -= 1

    async def worker(manager: aiolock.LockManager, seed: int) -> None:
        rw = manager.rw_lock("doc")
        rng = random.Random(seed)
        stop_at = time.monotonic() + 5
        for _ in range(120):
            if time.monotonic() > stop_at:
                break
            kind = rng.choice(("read", "read", "write"))
            side = rw.read if kind == "read" else rw.write
            timeout = rng.choice((0, 0.005, 0.02, 0.05, 1.0))
            if rng.random() < 0.15:  # cancelled at a random moment of its acquire
                attempt = asyncio.ensure_future(side(timeout=timeout).acquire())
                await asyncio.sleep(rng.random() * 0.01)
                attempt.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiolock.LockTimeoutError):
                    await attempt  # a hold it got is released when its task ends
                done["gave up"] += 1
                continue
            try:
                await side(timeout=timeout).acquire()
            except aiolock.LockTimeoutError:
                done["gave up"] += 1
                continue
            await inside(kind, rng)
            if kind == "write" and rng.random() < 0.3:  # downgrade, then read a while
                await rw.read().acquire()
                await rw.write().release()
                kind = "read"
                await inside(kind, rng)
            await (rw.write() if kind == "write" else rw.read()).release()
            done[kind] += 1

    await bounded(
        asyncio.gather(*(worker(m, i) for i in range(4) for m in (locks, other))), 60, "churn"
    )
    assert broken == []
    assert done["read"] > 0 and done["write"] > 0 and done["gave up"] > 0
    await eventually(
        lambda: locks.statistics().held + other.statistics().held == 0, what="nothing held"
    )
    assert locks.statistics().claims + other.statistics().claims == 0
    for _ in range(50):  # the holds of cancelled acquires are released in the background
        if not await admin.exists(*keys(prefix)):
            break
        await asyncio.sleep(0.1)
    assert await admin.exists(*keys(prefix)) == 0


async def test_re_entering_a_hold_that_ended_says_it_had_expired(
    locks: aiolock.LockManager, admin: Redis
) -> None:
    """The script answers a re-entry of an ended hold as "no key" (not a ttl of 0 ms,
    which would read as a holder with under a millisecond left)."""
    rw = locks.rw_lock("gone")
    await rw.read().acquire()
    await admin.delete(rw.key)  # the hold ends behind the manager's back
    with pytest.raises(aiolock.LockLostError, match="it had expired"):
        await rw.read().acquire()
