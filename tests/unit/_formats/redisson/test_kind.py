"""The ``redisson`` wire format against a protocol model of Redisson 3.52.0's RLock.

The model (tests/_support/redisson_protocol.py) sends what the Java client sends; no Java client
runs here. Lock names in this format are raw Redis keys, so every test builds its names
from its own unique prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

import aiolock
from tests._support.helpers import eventually
from tests._support.paths import REPO_ROOT
from tests._support.redisson_protocol import IllegalMonitorStateError, RedissonModel

LONG_LEASE_MS = 30_000  # Redisson's default watchdog lease: a waiter must never sleep it out


@pytest.fixture
async def model(redis: Redis) -> AsyncIterator[RedissonModel]:
    client = RedissonModel(redis)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def rlocks(redis: Redis, prefix: str) -> AsyncIterator[aiolock.LockManager]:
    async with aiolock.LockManager(redis, prefix=prefix, wire="redisson") as manager:
        yield manager


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# -- layout ------------------------------------------------------------------------------


async def test_a_lock_is_redissons_hash_at_the_raw_name(
    rlocks: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    name = f"{prefix}-layout"
    lock = rlocks.lock(name)
    assert lock.key == name
    async with lock:
        fields = await admin.hgetall(name)
        assert len(fields) == 1
        (field, count), *_ = fields.items()
        client_id, number = text(field).rsplit(":", 1)
        assert str(uuid.UUID(client_id)) == client_id  # a real UUID string
        assert re.fullmatch(r"\d+", number)
        assert count == b"1"
        assert 29_000 < await admin.pttl(name) <= 30_000  # the manager's lease
        async with lock:
            assert await admin.hget(name, field) == b"2"
            assert await lock.hold_count() == 2
        assert await admin.hget(name, field) == b"1"
    assert await admin.exists(name) == 0


async def test_two_managers_have_distinct_client_ids(
    redis: Redis, admin: Redis, prefix: str
) -> None:
    name = f"{prefix}-ids"
    seen = set()
    for _ in range(2):
        manager = aiolock.LockManager(redis, prefix=prefix, wire="redisson")
        async with manager, manager.lock(name):
            (field,) = await admin.hkeys(name)
            seen.add(text(field).rsplit(":", 1)[0])
    assert len(seen) == 2


async def test_kinds_without_a_faithful_mapping_are_refused(rlocks: aiolock.LockManager) -> None:
    with pytest.raises(aiolock.WireFormatError, match=r"RSemaphore.*no lease"):
        rlocks.semaphore("s", 2)
    with pytest.raises(aiolock.WireFormatError, match=r"no fair lock.*RFairLock"):
        rlocks.fair_lock("f")
    with pytest.raises(aiolock.WireFormatError, match="no read-write lock"):
        rlocks.rw_lock("r")
    # Per lock, aiolock's own format stays available on the same manager.
    assert rlocks.semaphore("s", 2, wire="aiolock").name == "s"


async def test_fencing_needs_fence_ttl_none(rlocks: aiolock.LockManager, prefix: str) -> None:
    async with rlocks.lock(f"{prefix}-nofence") as lock:
        with pytest.raises(aiolock.WireFormatError, match="fence_ttl=None"):
            _ = lock.fencing_token


async def test_tokens_come_from_rfencedlocks_counter(
    redis: Redis, admin: Redis, prefix: str
) -> None:
    name = f"{prefix}-fenced"
    fenced = RedissonModel(redis, fenced=True)
    try:
        async with aiolock.LockManager(
            redis, prefix=prefix, wire="redisson", fence_ttl=None
        ) as manager:
            lock = manager.lock(name)
            async with lock:
                first = lock.fencing_token
                assert first is not None
            assert await fenced.try_acquire(name, 1) is None
            assert fenced.token == first + 1
            await fenced.unlock(name, 1)
            async with lock:
                assert lock.fencing_token == first + 2
        assert await admin.get(f"redisson_lock_token:{{{name}}}") == str(first + 2).encode()
    finally:
        await fenced.aclose()


async def test_a_name_holding_another_type_is_reported_not_overwritten(
    rlocks: aiolock.LockManager, admin: Redis, prefix: str
) -> None:
    name = f"{prefix}-string"
    await admin.set(name, "not a lock")
    with pytest.raises(aiolock.LockKeyTypeError):
        await rlocks.lock(name).acquire(timeout=0)
    with pytest.raises(aiolock.LockKeyTypeError):
        await rlocks.lock(name).force_release()
    assert await admin.get(name) == b"not a lock"
    await admin.delete(name)


# -- exclusion ---------------------------------------------------------------------------


async def test_aiolock_and_redisson_exclude_each_other(
    rlocks: aiolock.LockManager, model: RedissonModel, prefix: str
) -> None:
    name = f"{prefix}-excl"
    lock = rlocks.lock(name)
    async with lock:
        ttl = await model.try_acquire(name, 1)
        assert ttl is not None and ttl > 25_000  # busy: Redisson gets the PTTL
        assert not await model.lock(name, 1, wait=0.2)
    assert await model.try_acquire(name, 1) is None
    with pytest.raises(aiolock.LockTimeoutError):
        await lock.acquire(timeout=0)
    with pytest.raises(aiolock.LockTimeoutError):
        await lock.acquire(timeout=0.2)
    await model.unlock(name, 1)
    await lock.acquire(timeout=0)
    assert await lock.owned()
    await lock.release()


async def test_reentrant_counts_interleave(
    rlocks: aiolock.LockManager, model: RedissonModel, prefix: str, admin: Redis
) -> None:
    name = f"{prefix}-reenter"
    lock = rlocks.lock(name)
    await lock.acquire()
    await lock.acquire()
    (field,) = await admin.hkeys(name)
    await lock.release()
    assert await admin.hget(name, field) == b"1"
    assert await model.try_acquire(name, 7) is not None  # still ours after one release
    await lock.release()
    for _ in range(3):
        assert await model.try_acquire(name, 7) is None
    assert await model.hold_count(name, 7) == 3
    for left in (2, 1):
        assert not await model.unlock(name, 7)
        assert await model.hold_count(name, 7) == left
        with pytest.raises(aiolock.LockTimeoutError):
            await lock.acquire(timeout=0)
    with pytest.raises(IllegalMonitorStateError):
        await model.unlock(name, 8)  # another Redisson thread cannot unlock it
    assert await model.unlock(name, 7)
    await lock.acquire(timeout=0)
    await lock.acquire(timeout=0)
    assert await lock.hold_count() == 2
    await lock.release()
    await lock.release()
    assert await admin.exists(name) == 0


async def test_a_multi_lock_takes_redissons_locks_of_every_name(
    rlocks: aiolock.LockManager, model: RedissonModel, prefix: str, admin: Redis
) -> None:
    names = [f"{prefix}-multi-{n}" for n in range(3)]
    assert await model.try_acquire(names[1], 1) is None
    multi = rlocks.multi_lock(names)
    with pytest.raises(aiolock.LockTimeoutError):
        await multi.acquire(timeout=0.2)
    assert await admin.exists(names[0], names[2]) == 0  # nothing left half-taken
    assert await model.unlock(names[1], 1)
    async with multi:
        assert await admin.exists(*names) == 3
        for name in names:
            assert await model.try_acquire(name, 2) is not None
    assert await admin.exists(*names) == 0


# -- waking each other -------------------------------------------------------------------


async def test_a_redisson_waiter_wakes_on_aiolocks_release(
    rlocks: aiolock.LockManager, model: RedissonModel, prefix: str
) -> None:
    name = f"{prefix}-wake-r"
    lock = rlocks.lock(name)  # the manager's 30 s lease, renewed: the PTTL is ~30 s
    await lock.acquire()
    waiter = asyncio.create_task(model.lock(name, 1))
    # Asleep on its latch, not just subscribed: released before its retry, it would take
    # the lock without being woken (the 0.1 s slept here before was not always enough).
    await eventually(lambda: model.stats.asleep == 1, what="the Redisson waiter asleep")
    released_at = time.monotonic()
    await lock.release()
    assert await asyncio.wait_for(waiter, 10.0)
    assert time.monotonic() - released_at < 5.0  # woken, not the 30 s lease
    assert model.stats.woken >= 1
    await model.unlock(name, 1)


async def test_an_aiolock_waiter_wakes_on_redissons_unlock(
    rlocks: aiolock.LockManager, model: RedissonModel, prefix: str
) -> None:
    name = f"{prefix}-wake-a"
    assert await model.try_acquire(name, 1) is None  # 30 s watchdog lease

    async def wait_for_it() -> float:
        async with rlocks.lock(name, timeout=10):
            return time.monotonic()

    waiter = asyncio.create_task(wait_for_it())
    await eventually(lambda: rlocks.statistics().hub.subscriptions == 1, what="subscription")
    await asyncio.sleep(0.1)
    released_at = time.monotonic()
    await model.unlock(name, 1)
    acquired_at = await asyncio.wait_for(waiter, 10.0)
    assert acquired_at - released_at < 5.0  # not the 30 s lease Redisson left
    assert rlocks.statistics().hub.messages >= 1


async def test_force_release_wakes_a_redisson_waiter(
    rlocks: aiolock.LockManager, model: RedissonModel, prefix: str, redis: Redis
) -> None:
    name = f"{prefix}-force"
    other = RedissonModel(redis)
    try:
        assert await other.try_acquire(name, 1) is None
        waiter = asyncio.create_task(model.lock(name, 2))
        await eventually(lambda: model.stats.asleep == 1, what="the Redisson waiter asleep")
        assert await rlocks.lock(name).force_release()
        assert await asyncio.wait_for(waiter, 5.0)
        await model.unlock(name, 2)
    finally:
        await other.aclose()


async def test_redisson_waiters_are_not_starved_by_a_busy_aiolock_manager(
    rlocks: aiolock.LockManager, model: RedissonModel, prefix: str
) -> None:
    # Four aiolock tasks take the lock back to back. After each release that the Redisson
    # client heard, aiolock yields for a moment; the echo of its own anonymous unlock
    # message must not end that yield, or the Redisson waiter loses nearly every race
    # (measured without that rule: median wait 0.07-1 s, worst 3-10 s; with it: ~2 ms).
    name = f"{prefix}-starve"
    stop = asyncio.Event()
    rounds = 0

    async def churn() -> None:
        nonlocal rounds
        while not stop.is_set():
            async with rlocks.lock(name, timeout=30):
                rounds += 1
                await asyncio.sleep(0.002)

    tasks = [asyncio.create_task(churn()) for _ in range(4)]
    waits = []
    try:
        await eventually(lambda: rounds >= 10, what="aiolock tasks churning")
        for _ in range(20):
            started = time.monotonic()
            assert await model.lock(name, 1, wait=10.0)
            waits.append(time.monotonic() - started)
            await asyncio.sleep(0.002)
            await model.unlock(name, 1)
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    waits.sort()
    assert waits[len(waits) // 2] < 0.25, f"median wait {waits[len(waits) // 2]:.3f} s"
    assert waits[-1] < 2.0, f"longest wait {waits[-1]:.3f} s"
    assert model.stats.timed_out == 0  # woken by messages, never by sleeping out a lease


async def test_a_local_hand_over_happens_only_while_nobody_else_listens(
    rlocks: aiolock.LockManager, prefix: str, redis: Redis
) -> None:
    # Nobody else subscribed: aiolock hands the lock straight to its next local task,
    # which is invisible to Redisson (the hash just changes field) and safe.
    name = f"{prefix}-handover"
    lock = rlocks.lock(name)
    order: list[int] = []

    async def take(n: int) -> None:
        async with lock:
            order.append(n)
            await asyncio.sleep(0.01)

    await asyncio.gather(*(take(n) for n in range(4)))
    assert sorted(order) == [0, 1, 2, 3]
    assert await redis.exists(name) == 0


# -- crashes and cancellation ------------------------------------------------------------


async def test_a_crashed_redisson_holders_lease_runs_out(
    rlocks: aiolock.LockManager, redis: Redis, prefix: str
) -> None:
    name = f"{prefix}-crash"
    crashed = RedissonModel(redis, watchdog_ms=600)
    try:
        assert await crashed.try_acquire(name, 1) is None
        await asyncio.sleep(0.5)  # the watchdog keeps it past its first lease
        assert await rlocks.lock(name).locked()
        crashed.crash()
        started = time.monotonic()
        async with rlocks.lock(name, timeout=20):
            waited = time.monotonic() - started
        # the 0.6 s lease ran out (with room for a loaded machine); not the 20 s timeout,
        # nor a 30 s sleep
        assert waited < 0.6 + 3.4, f"the waiter got the lock {waited:.2f} s after the crash"
    finally:
        await crashed.aclose()


async def test_a_cancelled_aiolock_waiter_leaves_nothing_behind(
    rlocks: aiolock.LockManager, model: RedissonModel, prefix: str, admin: Redis
) -> None:
    name = f"{prefix}-cancel"
    assert await model.try_acquire(name, 1) is None
    waiter = asyncio.create_task(rlocks.lock(name).acquire(timeout=10))
    await asyncio.sleep(0.1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await model.unlock(name, 1)
    assert await admin.exists(name) == 0
    assert await model.try_acquire(name, 2) is None
    await model.unlock(name, 2)


@pytest.mark.parametrize("delay", [0.0, 0.0005, 0.001, 0.002, 0.004])
async def test_an_acquire_cancelled_in_flight_never_leaves_the_lock_held(
    rlocks: aiolock.LockManager, model: RedissonModel, prefix: str, admin: Redis, delay: float
) -> None:
    name = f"{prefix}-inflight"
    lock = rlocks.lock(name)

    async def take_and_release() -> None:
        await lock.acquire(timeout=0)
        await lock.release()

    for _ in range(10):
        task = asyncio.create_task(take_and_release())
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await eventually(lambda: rlocks.statistics().pending_cleanups == 0, what="cleanups")
        assert await admin.exists(name) == 0
    assert await model.try_acquire(name, 1) is None
    await model.unlock(name, 1)


# -- a mixed fleet of processes ----------------------------------------------------------

CHILD = REPO_ROOT / "tests" / "_children" / "redisson.py"


def overlaps(events: list[str]) -> tuple[int, dict[str, int]]:
    """Replay the server-ordered events: entries while another is inside, and entries
    per name after a holder was killed (the killed one is inside until its 'killed')."""
    inside: dict[str, set[str]] = {}
    bad = 0
    after_kill: dict[str, int] = {}
    for line in events:
        event, name, who = line.split(" ")
        holders = inside.setdefault(name, set())
        if event == "enter":
            bad += bool(holders)
            holders.add(who)
            if name in after_kill:
                after_kill[name] += 1
        else:  # exit, or killed
            holders.discard(who)
            if event == "killed":
                after_kill[name] = 0
    return bad, after_kill


def test_the_overlap_replay_can_fail() -> None:
    clean = ["enter n a", "exit n a", "enter n b", "killed n b", "enter n c", "exit n c"]
    assert overlaps(clean) == (0, {"n": 1})
    assert overlaps(["enter n a", "enter n b", "exit n a", "exit n b"])[0] == 1
    assert overlaps(["enter n a", "enter m b", "exit n a", "exit m b"])[0] == 0


async def _spawn(spec: dict[str, object]) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), json.dumps(spec), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


@pytest.mark.processes
async def test_a_mixed_fleet_with_killed_holders_never_overlaps(
    redis_url: str, admin: Redis, prefix: str
) -> None:
    names = [f"{prefix}-fleet-a", f"{prefix}-fleet-b"]
    log = f"{prefix}-events"
    base = {
        "url": redis_url, "prefix": prefix, "log": log, "lease": 1.0, "timeout": 15.0,
        "max_seconds": 30.0, "tasks": 3, "acquisitions": 25, "names": names, "victim": False,
    }  # fmt: skip
    victims = {
        "aiolock": await _spawn({**base, "role": "aiolock", "victim": True, "tasks": 1,
                                 "acquisitions": 1, "names": names[:1]}),
        "redisson": await _spawn({**base, "role": "redisson", "victim": True, "tasks": 1,
                                  "acquisitions": 1, "names": names[1:]}),
    }  # fmt: skip
    fleet: list[asyncio.subprocess.Process] = []
    try:
        for proc in victims.values():
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 20.0)
            assert line.strip() == b"INSIDE", line
        fleet = [await _spawn({**base, "role": role}) for role in ("aiolock", "redisson") * 2]
        await asyncio.sleep(0.5)  # the fleet queues up behind the two holders
        for (role, proc), name in zip(victims.items(), names, strict=True):
            proc.kill()  # SIGKILL, by pid: no release, no more renewals
            await asyncio.wait_for(proc.wait(), 10.0)
            await admin.rpush(log, f"killed {name} {role}:{proc.pid}:1")
        outputs = []
        for proc in fleet:
            out, err = await asyncio.wait_for(proc.communicate(), 60.0)
            assert proc.returncode == 0, err.decode()[-2000:]
            outputs.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        for proc in [*victims.values(), *fleet]:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    events = [text(e) for e in await admin.lrange(log, 0, -1)]
    await admin.delete(log)
    bad, after_kill = overlaps(events)
    assert bad == 0, f"{bad} overlapping critical sections"
    assert sum(o["acquired"] for o in outputs) == 4 * 3 * 25
    assert sum(o["timeouts"] for o in outputs) == 0
    # Both crashed holders' leases ran out and the fleet went on on both names.
    assert after_kill.keys() == set(names)
    assert all(count > 0 for count in after_kill.values()), after_kill
    assert await admin.exists(*names) == 0


@pytest.mark.parametrize("delay", [0.0, 0.001, 0.003])
async def test_a_release_cancelled_in_flight_still_frees_the_lock_for_redisson(
    rlocks: aiolock.LockManager, model: RedissonModel, prefix: str, admin: Redis, delay: float
) -> None:
    name = f"{prefix}-relcancel"
    lock = rlocks.lock(name)
    acquired = asyncio.Event()

    async def hold_then_release() -> None:
        await lock.acquire(timeout=5)
        acquired.set()
        await asyncio.sleep(0.05)
        await lock.release()

    for _ in range(5):
        acquired.clear()
        task = asyncio.create_task(hold_then_release())
        await acquired.wait()
        await asyncio.sleep(0.05 + delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await eventually(lambda: rlocks.statistics().held == 0, what="the hold ended")
        assert await model.lock(name, 1, wait=5.0)
        assert await model.unlock(name, 1)
    assert await admin.exists(name) == 0
