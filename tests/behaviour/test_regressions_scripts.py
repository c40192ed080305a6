"""Regressions of issue 7 that engine v2 fixes (defects 4, 5 and the small ones of 13).

Each test failed on the engine before v2 (main at c7c504c); the failure is noted in its
docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster

import aiolock
from aiolock._keys import LockKeys
from aiolock.testing import RedisServer
from tests._support.clockshift import clockshift_server
from tests._support.helpers import closed_port

T = TypeVar("T")


async def until(
    check: Callable[[], Awaitable[bool]], *, timeout: float = 10.0, what: str = "condition"
) -> None:
    """Poll an async condition until it holds; fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


async def listeners(admin: Redis, channel: str) -> int:
    reply = await admin.pubsub_numsub(channel)
    return int(reply[0][1])


async def memory_under(admin: Redis, prefix: str) -> tuple[int, dict[str, int]]:
    """Total MEMORY USAGE (exact: SAMPLES 0) of the keys under *prefix*, and per key."""
    sizes: dict[str, int] = {}
    async for key in admin.scan_iter(match=f"{prefix}:*", count=1000):
        size = await admin.memory_usage(key, samples=0)
        if size is not None:
            sizes[key.decode() if isinstance(key, bytes) else str(key)] = int(size)
    return sum(sizes.values()), sizes


async def yield_fields(admin: Redis, prefix: str) -> dict[str, list[str]]:
    """The ``yield:*`` fields of every hash under *prefix*."""
    found: dict[str, list[str]] = {}
    async for key in admin.scan_iter(match=f"{prefix}:*", count=1000):
        if await admin.type(key) in (b"hash", "hash"):
            fields = [f.decode() if isinstance(f, bytes) else f for f in await admin.hkeys(key)]
            hits = [f for f in fields if f.startswith("yield:")]
            if hits:
                found[key.decode() if isinstance(key, bytes) else key] = hits
    return found


# -- defect 5: one 'yield:<manager id>' field per manager that ever yielded -------------------


async def test_short_lived_managers_leave_nothing_behind_on_a_busy_lock(
    redis_url: str, prefix: str, admin: Redis
) -> None:
    """30 short-lived managers each release while a long-lived manager's task listens.

    Before v2: every such release wrote ``yield:<manager id>`` into the meta hash and only
    that manager's next acquisition removed it, so the hash kept 30 fields (and the list of
    recent release ids) for ``fence_ttl`` (a day), renewed by every acquisition.
    """
    name = "busy"
    channel = LockKeys(prefix, name).channel
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as long_lived:

        async def wait_then_pass() -> None:
            async with long_lived.lock(name, timeout=10):
                pass

        for _ in range(30):
            async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as short:
                lock = short.lock(name)
                await lock.acquire(timeout=10)
                waiter = asyncio.create_task(wait_then_pass())
                await until(
                    lambda: _at_least(listeners(admin, channel), 1),
                    what="the long-lived manager listening",
                )
                await lock.release()
                await asyncio.wait_for(waiter, 10)
        assert not await long_lived.lock(name).locked()

        leftovers = await yield_fields(admin, prefix)
        assert not leftovers, f"'yield:' fields left in Redis: {leftovers}"
        # What stays is small: the open manager's identity record and the lock's free
        # state (issue 21: the epoch and the last token, kept fence_ttl; it replaced the
        # fence key and the release tombstones). The open manager's contention summary
        # (issue 38; deleted when it closes) is its own, not left by the others.
        summary = f"{prefix}:mgr:{{{long_lived.id}}}:top"

        async def left() -> tuple[int, dict[str, int]]:
            total, sizes = await memory_under(admin, prefix)
            return total - sizes.get(summary, 0), sizes

        deadline = time.monotonic() + 15
        total, sizes = await left()
        while total > 320 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            total, sizes = await left()
        assert total <= 320, f"{total} bytes left under {prefix!r}: {sizes}"


async def _at_least(count: Awaitable[int], minimum: int) -> bool:
    return await count >= minimum


# -- defect 4: a server clock stepped back keeps a free lock from being taken --------------


class LoopThread:
    """An event loop in a thread of its own, which the test can freeze and thaw: a
    stand-in for another process that stalls (GC pause, stopped container)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._thaw = threading.Event()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def freeze(self, limit: float = 60.0) -> None:
        frozen = threading.Event()

        def block() -> None:
            frozen.set()
            self._thaw.wait(limit)

        self._thaw.clear()
        self.loop.call_soon_threadsafe(block)
        await asyncio.to_thread(frozen.wait, 10)

    def thaw(self) -> None:
        self._thaw.set()

    def stop(self) -> None:
        self.thaw()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


async def test_a_free_lock_is_taken_after_the_server_clock_steps_back(
    tmp_path: Path, prefix: str
) -> None:
    """Manager B releases while manager A listens, then the server's clock steps back 60 s.

    Before v2: B's release recorded 'yield to the others until <server time + 20 ms>';
    with the clock 60 s behind, B's acquisitions of the free lock were refused for 60 s,
    so ``try_acquire(timeout=5)`` returned False.
    """
    name = "stepped"
    with clockshift_server(tmp_path) as server:
        admin = Redis.from_url(server.url)
        other = LoopThread()
        manager_a: aiolock.LockManager | None = None
        waiter_a: asyncio.Task[None] | None = None
        try:
            async with aiolock.LockManager.from_url(server.url, prefix=prefix) as manager_b:
                lock_b = manager_b.lock(name)
                await lock_b.acquire(timeout=5)

                async def open_a() -> tuple[aiolock.LockManager, asyncio.Task[None]]:
                    manager = aiolock.LockManager.from_url(server.url, prefix=prefix)
                    await manager.__aenter__()

                    async def wait_then_pass() -> None:
                        async with manager.lock(name, timeout=60):
                            pass

                    return manager, asyncio.create_task(wait_then_pass())

                manager_a, waiter_a = await other.run(open_a())
                channel = LockKeys(prefix, name).channel
                await until(lambda: _at_least(listeners(admin, channel), 1), what="A listening")
                await other.freeze()  # A stays subscribed but cannot take its turn
                await lock_b.release()  # others listen: B yields to them
                server.step(-60.0)
                started = time.monotonic()
                got = await lock_b.try_acquire(timeout=5)
                took = time.monotonic() - started
                assert got, f"a free lock was refused for {took:.1f} s after the clock stepped"
                await lock_b.release()
        finally:
            other.thaw()
            if manager_a is not None:
                await other.run(_close(manager_a, waiter_a))
            other.stop()
            await admin.aclose()


async def _close(manager: aiolock.LockManager, task: asyncio.Task[None] | None) -> None:
    if task is not None:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
    await manager.aclose()


# -- defect 13: small ones ------------------------------------------------------------------


def test_from_url_rejects_a_misspelt_option_at_the_call() -> None:
    """Before v2: ``leese`` went on to ``Redis.from_url`` and failed only at the first
    connection, far from the typo (no error at the call)."""
    with closed_port() as port, pytest.raises(TypeError, match="leese"):
        aiolock.LockManager.from_url(f"redis://127.0.0.1:{port}/0", leese=5)


async def test_a_cluster_client_is_accepted_and_a_sync_one_is_refused_clearly() -> None:
    """Before v2: the TypeError told a RedisCluster user to 'use LockManager.from_url(url)',
    which cannot help. Redis Cluster is supported now (tests/unit/_redis/test_cluster.py): the
    asyncio RedisCluster is taken without I/O; the synchronous one is refused with a
    message that names the asyncio cluster client."""
    from redis.asyncio.client import PubSub

    with closed_port() as port:  # nothing listens there: no I/O is expected
        cluster = RedisCluster(host="127.0.0.1", port=port)
        try:
            if hasattr(PubSub, "ssubscribe"):
                manager = aiolock.LockManager(cluster)
                assert manager.redis is cluster
            else:  # redis-py < 8: no sharded pub/sub in asyncio; the error says what is needed
                with pytest.raises(TypeError, match=r"redis-py >= 8\.0\.1"):
                    aiolock.LockManager(cluster)
        finally:
            await cluster.aclose()
    import redis.cluster

    with pytest.raises(TypeError) as caught:
        # (made without __init__, which would connect)
        sync_cluster = object.__new__(redis.cluster.RedisCluster)
        aiolock.LockManager(sync_cluster)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "redis.asyncio.cluster.RedisCluster" in message, message
    assert "cluster=True" in message, message


@pytest.mark.parametrize("method", ["acquire", "try_acquire"])
def test_public_signatures_do_not_mention_the_private_sentinel(method: str) -> None:
    """Before v2: ``(self, timeout: 'float | _Unset | None' = <_Unset.UNSET: 1>, ...)``."""
    signature = str(inspect.signature(getattr(aiolock.Lock, method)))
    assert "_unset" not in signature.lower(), signature


async def test_a_failed_read_does_not_talk_about_undoing(prefix: str) -> None:
    """Before v2: every connection error said 'aiolock undoes partial acquisitions and
    retries releases in the background', also for a read such as ``locked()``."""
    with RedisServer() as server:
        client = Redis.from_url(server.url, socket_connect_timeout=0.5, socket_timeout=2)
        try:
            async with aiolock.LockManager(client, prefix=prefix, close_timeout=1) as locks:
                lock = locks.lock("read")
                assert not await lock.locked()
                server.stop()
                for query in (lock.locked, lock.ttl):
                    with pytest.raises(aiolock.LockConnectionError) as caught:
                        await asyncio.wait_for(query(), 30)
                    assert "undo" not in str(caught.value).lower(), str(caught.value)
        finally:
            await client.aclose()


async def _hand_over(
    holders: aiolock.LockManager, waiters: aiolock.LockManager, name: str, rounds: int = 2
) -> None:
    """A task of *holders* holds *name*, a task of *waiters* waits for it, the holder lets
    go, and the waiter must get the lock within 5 s (room for a loaded machine; not when
    the 30 s lease runs out)."""
    for _ in range(rounds):
        took = await _hand_over_once(holders, waiters, name)
        assert took < 5.0, f"the waiter got the lock {took:.1f} s after its release"
    assert not await holders.lock(name).locked()


async def _hand_over_once(
    holders: aiolock.LockManager, waiters: aiolock.LockManager, name: str
) -> float:
    """Seconds from the holder's release to the waiter's entry."""
    held = asyncio.Event()
    let_go = asyncio.Event()
    released_at: list[float] = []
    took: list[float] = []

    async def holder() -> None:
        async with holders.lock(name, timeout=5):
            held.set()
            await let_go.wait()

    async def waiter() -> None:
        await held.wait()
        async with waiters.lock(name, timeout=20):
            took.append(time.monotonic() - released_at[0])

    tasks = [asyncio.create_task(holder()), asyncio.create_task(waiter())]
    try:
        await asyncio.wait_for(held.wait(), 10)
        await until(lambda: _waiting(waiters, tasks), timeout=10, what="the waiter waiting")
        # Give the waiter time to listen (up to 3 s: past its first retry, so that a
        # waiter that cannot listen sleeps through the release).
        await _soon(lambda: waiters.statistics().hub.subscriptions >= 1, 3.0)
        released_at.append(time.monotonic())
        let_go.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    finally:
        for task in tasks:
            task.cancel()
    assert took, "the waiter never got the lock"
    return took[0]


async def _waiting(locks: aiolock.LockManager, tasks: list[asyncio.Task[None]]) -> bool:
    for task in tasks:
        if task.done():
            task.result()  # raises what it raised
            raise AssertionError(f"{task!r} ended before the hand-over")
    return locks.statistics().hub.waiters >= 1


async def _soon(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll *predicate* for up to *timeout* seconds; whether it came true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def _enter(locks: aiolock.LockManager, name: str) -> None:
    async with locks.lock(name, timeout=5):
        await asyncio.sleep(0.01)


async def test_a_small_blocking_pool_is_enough(redis_url: str, prefix: str) -> None:
    """A client whose pool has 2 connections and waits 0.5 s for one.

    Before v2: two tasks acquiring at once left the manager keeping both connections
    between round trips, so its pub/sub connection could not be had ('pub/sub
    subscription change failed, will retry: No connection available') and a task waiting
    for another manager's release slept through it until its timeout.
    """
    pool = BlockingConnectionPool.from_url(redis_url, max_connections=2, timeout=0.5)
    client = Redis(connection_pool=pool)
    try:
        async with (
            aiolock.LockManager(client, prefix=prefix) as small,
            aiolock.LockManager.from_url(redis_url, prefix=prefix) as other,
        ):
            for _ in range(2):
                # two tasks acquiring (different locks) at the same moment
                await asyncio.wait_for(asyncio.gather(_enter(small, "a"), _enter(small, "b")), 10)
                await _hand_over(small, small, "pool")
                await _hand_over(other, small, "pool")
                await _hand_over(small, other, "pool")
    finally:
        await client.aclose()


async def test_a_single_connection_client_is_enough(redis_url: str, prefix: str) -> None:
    """``Redis(single_connection_client=True)``: acquire, wait for a release, release
    (within one manager and across managers, before and after the client was used)."""
    client = Redis.from_url(redis_url, single_connection_client=True)
    try:
        async with (
            aiolock.LockManager(client, prefix=prefix) as single,
            aiolock.LockManager.from_url(redis_url, prefix=prefix) as other,
        ):
            for _ in range(2):
                await _hand_over(single, single, "single")
                await _hand_over(other, single, "single")
                await _hand_over(single, other, "single")
                await client.ping()  # the client now has its one connection
    finally:
        await client.aclose()


def _names_in_slots(prefix: str, count: int, *, same: bool) -> list[str]:
    """*count* lock names whose keys fall in one slot (*same*) or in distinct slots."""
    from redis.crc import key_slot

    names: list[str] = []
    slots: set[int] = set()
    for i in range(100_000):
        name = f"n{i}"
        slot = key_slot(LockKeys(prefix, name).lock.encode())
        if (same and (not slots or slot in slots)) or (not same and slot not in slots):
            names.append(name)
            slots.add(slot)
            if len(names) == count:
                return names
    raise AssertionError("no such names found")


@pytest.mark.parametrize("same", [True, False], ids=["one-slot", "three-slots"])
@pytest.mark.parametrize("by_slot", [True, False], ids=["cluster", "single-node"])
async def test_renewal_batches_never_mix_slots(
    redis: Redis, prefix: str, same: bool, by_slot: bool
) -> None:
    """Issue 7, defect 12: renew.lua said a batch never spans Redis Cluster slots, but the
    watchdog sent every hold in one batch. Grouped by slot (as Redis Cluster needs), one
    renewal round sends one script call per slot, one for all the holds of a slot; on a
    single node (today's only topology) one call for them all, whatever their slots."""
    async with aiolock.LockManager(redis, prefix=prefix, lease=30) as locks:
        names = _names_in_slots(prefix, 3, same=same)
        held = [locks.lock(name) for name in names]
        for lock in held:
            await lock.acquire()
        engine = locks._open_engine()
        assert engine.watchdog.group_by_slot is False  # the default for a single server
        engine.watchdog.group_by_slot = by_slot
        before = locks.statistics().renewal_round_trips
        assert await engine.watchdog.renew_all()
        sent = locks.statistics().renewal_round_trips - before
        assert sent == (3 if by_slot and not same else 1)
        for lock in held:
            assert await lock.owned()
            await lock.release()


async def test_an_exhausted_pool_is_named_as_such(redis_url: str, prefix: str) -> None:
    """Issue 7, defect 13: a pool with no connection left was reported as 'Redis could not
    be reached'. The error now says the pool is exhausted and what to do."""
    pool = BlockingConnectionPool.from_url(redis_url, max_connections=2, timeout=0.2)
    client = Redis(connection_pool=pool)
    taken: list[Any] = []
    try:
        # (open()'s check would keep a connection of the pool for the manager's next round trip)
        async with aiolock.LockManager(client, prefix=prefix, check_on_open=False) as locks:
            # Somebody else holds every connection of the shared pool.
            taken = [await pool.get_connection() for _ in range(2)]  # type: ignore[no-untyped-call]
            with pytest.raises(aiolock.LockConnectionError) as caught:
                await locks.lock("starved").locked()
            message = str(caught.value)
            assert "pool" in message and "max_connections" in message, message
            assert "could not be reached" not in message, message
            for conn in taken:
                await pool.release(conn)
            taken = []
            assert not await locks.lock("starved").locked()
    finally:
        for conn in taken:
            await pool.release(conn)
        await client.aclose()
