"""``replicas=``: WAIT after every acquisition, on the connection that ran it.

A primary and one replica per module (redis-server processes started here, stopped by
pid). A stopped replica (SIGSTOP) is how a replica that does not acknowledge is made:
WAIT on the acquire's own connection then times out with 0, while a WAIT sent on any
other connection (which wrote nothing) would have answered at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock.testing import RedisServer
from tests._support.helpers import eventually, lock_held

NODE_ARGS = ["--repl-diskless-sync-delay", "0"]


class Pair:
    def __init__(self, primary: RedisServer, replica: RedisServer) -> None:
        self.primary = primary
        self.replica = replica


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with RedisServer(NODE_ARGS) as primary:
        args = [*NODE_ARGS, "--replicaof", primary.host, str(primary.port)]
        with RedisServer(args) as replica:
            _wait_in_sync(replica)
            yield Pair(primary, replica)


def _wait_in_sync(replica: RedisServer) -> None:
    import redis

    client = redis.Redis(host=replica.host, port=replica.port)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if client.info("replication").get("master_link_status") == "up":
                return
            time.sleep(0.02)
        raise AssertionError("the replica did not sync")
    finally:
        client.close()


@pytest.fixture
async def primary(pair: Pair) -> AsyncIterator[Redis]:
    client = Redis.from_url(pair.primary.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def replica(pair: Pair) -> AsyncIterator[Redis]:
    client = Redis.from_url(pair.replica.url)
    try:
        yield client
    finally:
        await client.aclose()


async def _waits(node: Redis) -> int:
    stats = await node.info("commandstats")
    entry = stats.get("cmdstat_wait", {})
    return int(entry.get("calls", 0)) if isinstance(entry, dict) else 0


def _manager(pair: Pair, prefix: str, **options: Any) -> aiolock.LockManager:
    return aiolock.LockManager.from_url(pair.primary.url, prefix=prefix, **options)


class _Stopped:
    """The replica stopped (SIGSTOP) for the duration, so it acknowledges nothing."""

    def __init__(self, server: RedisServer) -> None:
        self.pid = server.pid
        assert self.pid is not None

    def __enter__(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)  # type: ignore[arg-type]

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)  # type: ignore[arg-type]


KINDS = ["lock", "fair", "write", "semaphore", "multi"]


def _handle(locks: aiolock.LockManager, kind: str, name: str) -> Any:
    if kind == "lock":
        return locks.lock(name)
    if kind == "fair":
        return locks.fair_lock(name)
    if kind == "write":
        return locks.rw_lock(name).write()
    if kind == "multi":
        return locks.multi_lock([f"{name}1", f"{name}2"])
    return locks.semaphore(name, 2)


@pytest.mark.parametrize("kind", KINDS)
async def test_each_acquisition_is_acknowledged_by_the_replica(
    pair: Pair, prefix: str, primary: Redis, replica: Redis, kind: str
) -> None:
    async with _manager(pair, prefix, replicas=1, replica_timeout=2.0) as locks:
        async with _handle(locks, kind, "warm-up"):  # the server loads the scripts
            pass
        before = await _waits(primary)
        async with _handle(locks, kind, "a"):
            # WAIT answered 1 for the grant: the replica has it already.
            assert await replica.dbsize() > 0
            keys = await replica.keys(f"{prefix}:*")
            assert keys
        # one WAIT per grant (a multi-lock takes two)
        assert await _waits(primary) == before + (2 if kind == "multi" else 1)


async def test_min_replicas_to_write_refusal_is_named(
    pair: Pair, prefix: str, primary: Redis
) -> None:
    await primary.config_set("min-replicas-to-write", 2)
    try:
        async with _manager(pair, prefix) as locks:
            with pytest.raises(aiolock.LockBackendError, match="min-replicas-to-write"):
                await locks.lock("a").acquire(timeout=1)
        assert not await lock_held(primary, f"{prefix}:lock:{{a}}")
    finally:
        await primary.config_set("min-replicas-to-write", 0)


async def test_a_replica_that_does_not_acknowledge_undoes_the_acquisition(
    pair: Pair, prefix: str, primary: Redis
) -> None:
    async with _manager(pair, prefix, replicas=1, replica_timeout=0.3) as locks:
        with _Stopped(pair.replica):
            started = time.monotonic()
            with pytest.raises(aiolock.ReplicaAckError, match="only 0 of the 1 replicas") as e:
                await locks.lock("a").acquire()
            took = time.monotonic() - started
        # the 0.3 s replica_timeout (room for a loaded machine), not a WAIT without end
        assert 0.25 <= took < 3.0, f"the 0.3 s replica_timeout ended after {took:.2f} s"
        assert "replica_timeout" in str(e.value) and "on_replica_shortfall" in str(e.value)
        # Undone: nobody holds it, and another manager takes it at once.
        assert not await lock_held(primary, f"{prefix}:lock:{{a}}")
        async with _manager(pair, prefix) as other, other.lock("a", timeout=0):
            pass
        # With the replica back, acquisitions are acknowledged again.
        async with locks.lock("a", timeout=5):
            pass
        assert locks.statistics().held == 0


async def test_too_many_replicas_asked(pair: Pair, prefix: str, primary: Redis) -> None:
    async with _manager(pair, prefix, replicas=2, replica_timeout=1.0) as locks:
        with pytest.raises(aiolock.ReplicaAckError, match="only 1 of the 2 replicas"):
            await locks.semaphore("s", 3).acquire()
        assert await primary.exists(f"{prefix}:sem:{{s}}") == 0


async def test_on_replica_shortfall_warn_keeps_it(
    pair: Pair, prefix: str, primary: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    async with _manager(
        pair, prefix, replicas=2, replica_timeout=1.0, on_replica_shortfall="warn"
    ) as locks:
        with caplog.at_level(logging.WARNING, logger="aiolock"):
            async with locks.lock("a"):
                assert await primary.exists(f"{prefix}:lock:{{a}}") == 1
        assert "only 1 of the 2 replicas" in caplog.text
        assert "keeping it" in caplog.text


async def test_wait_refused_says_how_to_turn_it_off(
    pair: Pair, prefix: str, primary: Redis
) -> None:
    user = f"nowait-{prefix}"
    await primary.acl_setuser(
        user,
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-wait"],
    )
    try:
        url = f"redis://{user}:pw@{pair.primary.host}:{pair.primary.port}/0"
        async with aiolock.LockManager.from_url(url, prefix=prefix, replicas=1) as locks:
            with pytest.raises(aiolock.ReplicaAckError, match="refused WAIT") as caught:
                await locks.lock("a").acquire()
            assert "without replicas=" in str(caught.value)
            assert not await lock_held(primary, f"{prefix}:lock:{{a}}")
    finally:
        await primary.acl_deluser(user)


async def test_scripts_unknown_to_the_server_are_loaded_and_waited_for(
    pair: Pair, prefix: str, primary: Redis, replica: Redis
) -> None:
    async with _manager(pair, prefix, replicas=1, replica_timeout=2.0) as locks:
        await primary.script_flush()
        before = await _waits(primary)
        async with locks.lock("a"):
            assert await replica.exists(f"{prefix}:lock:{{a}}") == 1
        # The first WAIT followed the EVALSHA that NOSCRIPT refused; the second, the
        # script that ran: both on the same connection, and the acquisition confirmed.
        assert await _waits(primary) - before in (1, 2)


async def test_a_cancelled_acquire_blocked_in_wait_is_undone(
    pair: Pair, prefix: str, primary: Redis
) -> None:
    async with _manager(pair, prefix, replicas=1, replica_timeout=3.0) as locks:
        with _Stopped(pair.replica):
            task = asyncio.create_task(locks.lock("a").acquire())

            async def granted() -> bool:
                return await lock_held(primary, f"{prefix}:lock:{{a}}")

            await eventually(granted, what="the script to run")  # and WAIT blocks
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The undo went out on another connection while WAIT still blocks its own.
            for _ in range(150):
                if not await lock_held(primary, f"{prefix}:lock:{{a}}"):
                    break
                await asyncio.sleep(0.02)
            assert not await lock_held(primary, f"{prefix}:lock:{{a}}")
        assert locks.statistics().held == 0


async def test_reentry_and_concurrent_acquisitions(pair: Pair, prefix: str, primary: Redis) -> None:
    async with _manager(pair, prefix, replicas=1, replica_timeout=2.0, max_in_flight=2) as locks:
        async with locks.lock("warm-up"):
            pass
        before = await _waits(primary)
        async with locks.lock("a"), locks.lock("a"):  # the re-entry adds no grant: no WAIT
            pass
        assert await _waits(primary) == before + 1

        async def take(i: int) -> None:
            async with locks.lock(f"n{i}", timeout=10):
                await asyncio.sleep(0.01)

        await asyncio.wait_for(asyncio.gather(*(take(i) for i in range(20))), timeout=20)
        assert await _waits(primary) == before + 21
        # Waiters served one after another: each grant is its own acknowledged attempt
        # (no hand-over within the manager, which would skip WAIT).
        await asyncio.wait_for(asyncio.gather(*(take(0) for _ in range(5))), timeout=20)
        assert await _waits(primary) == before + 26


async def test_acquisitions_under_replicas_take_the_engine(
    pair: Pair, prefix: str, primary: Redis
) -> None:
    """Issue 21: the fast path never grants under replicas= (the manager's or a handle's):
    every such grant is the engine's acknowledged attempt."""
    async with _manager(pair, prefix, replicas=1, replica_timeout=2.0) as locks:
        engine = locks._engine
        assert engine is not None
        async with locks.lock("m"):
            pass
        assert (engine.fast_acquired, engine.acquired["lock"]) == (0, 1)
    async with _manager(pair, prefix) as locks:
        engine = locks._engine
        assert engine is not None
        async with locks.lock("warm-up"):  # the server loads the scripts
            pass
        before = await _waits(primary)
        async with locks.lock("h", replicas=1, replica_timeout=2.0):
            pass
        assert await _waits(primary) == before + 1
        assert (engine.fast_acquired, engine.acquired["lock"]) == (1, 2)  # warm-up only
        async with locks.lock("h"):  # the same name without replicas=: fast, no WAIT
            pass
        assert await _waits(primary) == before + 1
        assert (engine.fast_acquired, engine.acquired["lock"]) == (2, 3)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"replicas": "1"}, TypeError, "replicas must be an int"),
        ({"replicas": True}, TypeError, "replicas must be an int"),
        ({"replicas": -1}, ValueError, "between 0 and 100"),
        ({"replicas": 1, "replica_timeout": 0}, ValueError, "replica_timeout"),
        ({"replicas": 1, "replica_timeout": "1"}, TypeError, "replica_timeout"),
        ({"replicas": 1, "on_replica_shortfall": "ignore"}, ValueError, "'raise'"),
        ({"on_replica_shortfall": "ignore"}, ValueError, "'raise'"),
        ({"replica_timeout": -1}, ValueError, "replica_timeout"),
        (
            {"replicas": 1, "replica_timeout": 2.0, "command_timeout": 1.0},
            ValueError,
            "shorter than command_timeout",
        ),
    ],
)
def test_options_are_checked_at_the_call(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        aiolock.LockManager(Redis(), **options)


def test_replicas_zero_or_none_is_off() -> None:
    for replicas in (None, 0):
        manager = aiolock.LockManager(Redis(), replicas=replicas)
        assert manager._runtime.replicas is None


async def test_wait_unknown_to_the_server_says_how_to_turn_it_off(prefix: str) -> None:
    # A hosted service that does not offer WAIT answers "unknown command".
    with RedisServer(["--rename-command", "WAIT", ""]) as server:
        async with aiolock.LockManager.from_url(server.url, prefix=prefix, replicas=1) as locks:
            with pytest.raises(aiolock.ReplicaAckError, match="refused WAIT") as caught:
                await locks.lock("a").acquire()
            assert "unknown command" in str(caught.value)
            assert "replicas=0" in str(caught.value)
            assert not await lock_held(locks.redis, f"{prefix}:lock:{{a}}")
            assert locks.statistics().held == 0


async def test_a_second_manager_on_the_same_client_for_some_locks(
    pair: Pair, prefix: str, primary: Redis
) -> None:
    """The documented way to acknowledge only some locks: a second manager, one client."""
    redis = Redis.from_url(pair.primary.url)
    try:
        async with (
            aiolock.LockManager(redis, prefix=prefix) as plain,
            aiolock.LockManager(redis, prefix=prefix, replicas=1, replica_timeout=2.0) as acked,
        ):
            async with plain.lock("warm-up"), acked.lock("warm-up2"):
                pass
            before = await _waits(primary)
            async with plain.lock("a"):
                assert await _waits(primary) == before
                with pytest.raises(aiolock.LockTimeoutError):
                    await acked.lock("a").acquire(timeout=0.1)
            async with acked.lock("a"):
                assert await _waits(primary) > before
                with pytest.raises(aiolock.LockTimeoutError):
                    await plain.lock("a").acquire(timeout=0)
    finally:
        await redis.aclose()


# -- replicas= per lock ---------------------------------------------------------------


def _handle_with(locks: aiolock.LockManager, kind: str, name: str, **options: Any) -> Any:
    """_handle, with per-lock options given to the factory."""
    if kind == "lock":
        return locks.lock(name, **options)
    if kind == "fair":
        return locks.fair_lock(name, **options)
    if kind == "write":
        return locks.rw_lock(name, **options).write()
    if kind == "multi":
        return locks.multi_lock([f"{name}1", f"{name}2"], **options)
    return locks.semaphore(name, 2, **options)


@pytest.mark.parametrize("kind", KINDS)
async def test_replicas_per_lock_on_a_manager_without(
    pair: Pair, prefix: str, primary: Redis, kind: str
) -> None:
    """A lock made with replicas=1 waits for the replica; the manager's other locks do not."""
    async with _manager(pair, prefix) as locks:
        async with _handle(locks, kind, "warm-up"):
            pass
        before = await _waits(primary)
        async with _handle_with(locks, kind, "acked", replicas=1, replica_timeout=2.0):
            pass
        assert await _waits(primary) == before + (2 if kind == "multi" else 1)
        async with _handle(locks, kind, "plain"):
            pass
        assert await _waits(primary) == before + (2 if kind == "multi" else 1)


async def test_replicas_0_per_lock_turns_the_managers_wait_off(
    pair: Pair, prefix: str, primary: Redis
) -> None:
    async with _manager(pair, prefix, replicas=1, replica_timeout=2.0) as locks:
        async with locks.lock("warm-up"):
            pass
        before = await _waits(primary)
        async with locks.lock("fast", replicas=0):
            pass
        async with locks.rw_lock("fast-rw", replicas=0).read():
            pass
        assert await _waits(primary) == before
        async with locks.lock("acked"):
            pass
        assert await _waits(primary) == before + 1


async def test_a_per_lock_shortfall_undoes_only_that_lock(pair: Pair, prefix: str) -> None:
    """replicas=2 on one lock with one replica: ReplicaAckError, the lock is free again;
    a lock of the same manager without the option is unaffected."""
    async with _manager(pair, prefix) as locks:
        with pytest.raises(aiolock.ReplicaAckError, match="only 1 of the 2 replicas"):
            await locks.lock("greedy", replicas=2, replica_timeout=1.0).acquire(timeout=0)
        assert locks.statistics().held == 0
        async with locks.lock("greedy", timeout=0):  # undone: free
            pass


async def test_a_waiter_under_replicas_is_never_handed_the_lock(
    pair: Pair, prefix: str, primary: Redis
) -> None:
    """A release hands the lock to a local waiter without a new grant request; a waiter
    whose lock has replicas= must get its grant by an acknowledged attempt instead."""
    async with _manager(pair, prefix) as locks:
        holder = locks.lock("h")
        await holder.acquire()
        entered = asyncio.Event()

        async def waiter() -> None:
            async with locks.lock("h", replicas=1, replica_timeout=2.0, timeout=10):
                entered.set()

        task = asyncio.create_task(waiter())
        for _ in range(500):  # waiting, subscribed: it sends nothing until woken
            stats = locks.statistics().hub
            if stats.waiters == 1 and stats.subscriptions == 1:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        before = await _waits(primary)
        await holder.release()
        await asyncio.wait_for(task, timeout=10)
        assert entered.is_set()
        # The grant after the release came from an attempt followed by WAIT; a hand-over
        # (the release script granting it) would have sent none.
        assert await _waits(primary) > before


def test_per_lock_options_are_checked_at_the_call(pair: Pair, prefix: str) -> None:
    locks = _manager(pair, prefix)
    with pytest.raises(ValueError, match="replica_timeout= needs replicas="):
        locks.lock("x", replica_timeout=1.0)
    with pytest.raises(TypeError, match="replicas must be an int"):
        locks.fair_lock("x", replicas="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="between 0 and 100"):
        locks.semaphore("x", 2, replicas=-1)
    with pytest.raises(ValueError, match="replica_timeout"):
        locks.rw_lock("x", replicas=1, replica_timeout=-1)
    acked = _manager(pair, prefix, command_timeout=1.0)
    with pytest.raises(ValueError, match="shorter than command_timeout"):
        acked.multi_lock(["x", "y"], replicas=1, replica_timeout=2.0)
