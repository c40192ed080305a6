"""redis-server restarts (no persistence: every lock is gone) while locks are held and
awaited; then it stays down for longer than the lease.

Holders inside ``async with`` must get ``LockLostError`` (the renewal finds the key gone,
or the lease deadline passes while Redis is unreachable); waiters and new acquisitions
carry on once Redis is back; the same manager keeps working; nothing hangs.

The lock client fails fast while the server is down (a short retry policy); waiters
treat ``LockConnectionError`` as "try again", as an application would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

import aiolock
from aiolock.testing import RedisServer
from tests._support.faults import bounded, eventually, unique_prefix

LEASE = 1.0


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def _client(url: str) -> Redis:
    return Redis.from_url(
        url,
        socket_timeout=2.0,
        socket_connect_timeout=1.0,
        retry=Retry(ExponentialBackoff(cap=0.1, base=0.01), 2),
    )


class Scene:
    """Holders inside ``async with`` and waiters queued behind them, in two managers."""

    def __init__(self, main: aiolock.LockManager, other: aiolock.LockManager) -> None:
        self.main = main
        self.other = other
        self.inside = asyncio.Event()
        self.entered = 0
        self.holder_tokens: dict[str, int] = {}
        self.holder_outcomes: dict[str, tuple[str, float]] = {}
        self.waiter_tokens: list[tuple[str, int]] = []
        self.connection_errors = 0
        self.unexpected: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.holders: list[asyncio.Task[None]] = []

    async def holder(self, name: str) -> None:
        lock = self.main.lock(name, timeout=10)
        try:
            async with lock:
                assert lock.fencing_token is not None
                self.holder_tokens[name] = lock.fencing_token
                self.entered += 1
                if self.entered == 3:
                    self.inside.set()
                await asyncio.sleep(60)
            self.holder_outcomes[name] = ("no error", time.monotonic())
        except aiolock.LockError as exc:
            self.holder_outcomes[name] = (type(exc).__name__, time.monotonic())

    async def waiter(self, locks: aiolock.LockManager, name: str) -> None:
        for _ in range(200):
            lock = locks.lock(name, timeout=30)
            try:
                async with lock:
                    assert lock.fencing_token is not None
                    self.waiter_tokens.append((name, lock.fencing_token))
                    await asyncio.sleep(0.01)
                return
            except aiolock.LockConnectionError:
                self.connection_errors += 1
                await asyncio.sleep(0.1)
            except aiolock.LockError as exc:  # e.g. a waiter's own hold lost: not expected
                self.unexpected.append(f"{name}: {type(exc).__name__}: {exc}")
                return
        self.unexpected.append(f"{name}: gave up after 200 attempts")

    async def start(self) -> None:
        self.holders = [asyncio.create_task(self.holder(f"h{i}")) for i in range(3)]
        await bounded(self.inside.wait(), 10, "the holders entering")
        for _ in range(4):
            self.tasks.append(asyncio.create_task(self.waiter(self.main, "h0")))
        for _ in range(2):
            self.tasks.append(asyncio.create_task(self.waiter(self.main, "h1")))
        for _ in range(3):
            self.tasks.append(asyncio.create_task(self.waiter(self.other, "h2")))

        def queued() -> bool:
            # main listens on each of its holders' channels too (for a release it did not
            # make), once they are listened for: its waiters' two and h2's
            a, b = self.main.statistics().hub, self.other.statistics().hub
            return self.main._open_engine().heed.listened == 3 and (
                a.waiters,
                b.waiters,
                a.subscriptions,
                b.subscriptions,
            ) == (6, 3, 3, 1)

        await eventually(queued, what="9 waiters queued")

    async def check_after(self, fault_at: float) -> None:
        await bounded(asyncio.gather(*self.holders), 15, "the holders")
        await bounded(asyncio.gather(*self.tasks), 40, "the waiters")
        assert self.unexpected == []
        assert sorted(self.holder_outcomes) == ["h0", "h1", "h2"]
        for name, (outcome, at) in self.holder_outcomes.items():
            assert outcome == "LockLostError", (name, outcome)
            assert at - fault_at < LEASE + 5.0, (name, at - fault_at)
        assert sorted(n for n, _ in self.waiter_tokens) == ["h0"] * 4 + ["h1"] * 2 + ["h2"] * 3
        for name, token in self.waiter_tokens:  # tokens still increase across the restart
            assert token > self.holder_tokens[name], (name, token, self.holder_tokens)

    async def check_managers_work(self) -> None:
        for locks in (self.main, self.other):
            lock = locks.lock("h0", timeout=10)
            async with lock:
                assert await lock.hold_count() == 1
            assert await locks.lock("new", timeout=0).try_acquire()
            await locks.lock("new").release()

            def drained(m: aiolock.LockManager = locks) -> bool:
                s = m.statistics()
                return (s.held, s.hub.waiters, s.hub.queues, s.pending_cleanups) == (0, 0, 0, 0)

            await eventually(drained, timeout=15, what="the manager to drain")


async def test_restart_while_locks_are_held_and_awaited(own_server: RedisServer) -> None:
    prefix = unique_prefix("restart")
    clients = [_client(own_server.url) for _ in range(2)]
    try:
        async with (
            aiolock.LockManager(clients[0], prefix=prefix, lease=LEASE) as main,
            aiolock.LockManager(clients[1], prefix=prefix, lease=LEASE) as other,
        ):
            scene = Scene(main, other)
            await scene.start()
            fault_at = time.monotonic()
            await bounded(asyncio.to_thread(own_server.restart), 30, "the restart")
            await scene.check_after(fault_at)
            await scene.check_managers_work()
    finally:
        for client in clients:
            await client.aclose()
    print(f"\nrestart: connection errors seen by waiters: {scene.connection_errors}")


async def test_redis_down_longer_than_the_lease(own_server: RedisServer) -> None:
    prefix = unique_prefix("down")
    clients = [_client(own_server.url) for _ in range(2)]
    try:
        async with (
            aiolock.LockManager(clients[0], prefix=prefix, lease=LEASE) as main,
            aiolock.LockManager(clients[1], prefix=prefix, lease=LEASE) as other,
        ):
            scene = Scene(main, other)
            await scene.start()
            own_server.stop()
            down_at = time.monotonic()
            # The holders learn of the loss from their own deadline: Redis is unreachable.
            await bounded(asyncio.gather(*scene.holders), LEASE + 10, "the holders, Redis down")
            lost_after = max(at for _, at in scene.holder_outcomes.values()) - down_at
            assert lost_after < LEASE + 1.0, lost_after
            await asyncio.sleep(LEASE)  # stay down a while longer; waiters keep trying
            await bounded(asyncio.to_thread(own_server.start), 30, "starting Redis again")
            await scene.check_after(down_at)
            await scene.check_managers_work()
    finally:
        for client in clients:
            await client.aclose()
    print(
        f"\ndown: holders lost after {lost_after:.2f} s without Redis; "
        f"connection errors seen by waiters: {scene.connection_errors}"
    )


async def test_a_reconnect_made_by_the_redis_client_is_counted(own_server: RedisServer) -> None:
    """Issue 24, item 7: with a patient retry policy redis-py re-establishes the pub/sub
    connection inside a read and subscribes again by itself, so the hub's reader sees
    no failure; ``hub.reconnects`` stayed 0 although the connection was lost."""
    prefix = unique_prefix("reconnect")
    patient = Redis.from_url(
        own_server.url,
        socket_timeout=2.0,
        socket_connect_timeout=1.0,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 60),
    )
    holder_client = _client(own_server.url)
    try:
        async with (
            aiolock.LockManager(holder_client, prefix=prefix, lease=30) as holder,
            aiolock.LockManager(patient, prefix=prefix, lease=30) as waiting,
        ):
            await holder.lock("busy").acquire()  # lost with the restart (no persistence)
            acquired = asyncio.Event()

            async def waiter() -> None:
                async with waiting.lock("busy", timeout=60):
                    acquired.set()

            task = asyncio.create_task(waiter())
            await eventually(
                lambda: waiting.statistics().hub.subscriptions == 1, what="the subscription"
            )
            assert waiting.statistics().hub.reconnects == 0
            await bounded(asyncio.to_thread(own_server.restart), 30, "the restart")
            await eventually(
                lambda: waiting.statistics().hub.reconnects >= 1,
                timeout=30,
                what="the reconnect to be counted",
            )
            # Woken by the repeated confirmation: the lock went with the restart.
            await bounded(acquired.wait(), 30, "the waiter, after the restart")
            await bounded(task, 10, "the waiter's exit")
    finally:
        await patient.aclose()
        await holder_client.aclose()
