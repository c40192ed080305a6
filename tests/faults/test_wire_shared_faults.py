"""Lost replies between aiolock and Redis, for the formats shared with other clients.

``wire="token"`` and ``wire="timestamp"`` keep the lock at the raw name, where another
client (redis-py's ``Lock``, a legacy SETNX/GETSET client) may take it the moment
aiolock lets go. So:

* an acquire that ran on Redis but whose reply was lost is undone, and the other client
  gets the lock long before aiolock's lease would have ended;
* a release that ran but whose reply was lost, sent again once the other client holds
  the lock, answers as the first did (its tombstone) and leaves the other client's lock
  alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import aiolock
from aiolock.testing import RedisServer
from tests._children.wire_fleet import legacy_release, legacy_try
from tests._support.faults import bounded, eventually, unique_prefix
from tests._support.proxy import FaultProxy

LEASE = 30.0  # long: an orphaned hold would visibly outlive every bound below


class Other:
    """The other client on the name: redis-py's Lock (token) or the legacy recipe."""

    def __init__(self, wire: str, url: str, name: str) -> None:
        self.wire, self.name = wire, name
        self.client = redis.Redis.from_url(url)
        self.lock = self.client.lock(name, timeout=LEASE)
        self.value: str | None = None

    def try_acquire(self) -> bool:
        if self.wire == "token":
            return bool(self.lock.acquire(blocking=False))
        self.value = legacy_try(self.client, self.name, int(LEASE * 1000))
        return self.value is not None

    def holds(self) -> bool:
        if self.wire == "token":
            return bool(self.lock.owned())
        return self.value is not None and self.client.get(self.name) == self.value.encode()

    def release(self) -> None:
        if self.wire == "token":
            self.lock.release()
        else:
            assert self.value is not None
            legacy_release(self.client, self.name, self.value)


@pytest.fixture(params=["token", "timestamp"])
def wire(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture
async def locks(fault_proxy: FaultProxy, wire: Any) -> AsyncIterator[aiolock.LockManager]:
    client = Redis.from_url(fault_proxy.url, retry=Retry(NoBackoff(), 0))
    manager = aiolock.LockManager(
        client, prefix=unique_prefix("wire"), lease=LEASE, command_timeout=0.5, wire=wire
    )
    try:
        async with manager:
            async with manager.lock(f"{manager.prefix}:warm-up", timeout=5):
                pass  # connected, scripts loaded, before any fault
            yield manager
    finally:
        await client.aclose()


async def test_an_acquire_whose_reply_is_lost_is_undone_for_the_other_client(
    fault_proxy: FaultProxy,
    fault_redis_server: RedisServer,
    locks: aiolock.LockManager,
    wire: str,
) -> None:
    name = f"{locks.prefix}:amb"
    direct = Redis.from_url(fault_redis_server.url)
    other = Other(wire, fault_redis_server.url, name)
    try:
        fault_proxy.blackhole("downstream")  # the command runs, its reply is lost
        attempt = asyncio.create_task(locks.lock(name).acquire(timeout=0))
        await eventually(lambda: _exists(direct, name), what="the acquire to run on Redis")
        with pytest.raises(aiolock.LockConnectionError):
            await bounded(attempt, 30, "the ambiguous acquire")
        fault_proxy.restore()
        started = time.monotonic()
        # The undo (retried in the background) frees it: not the 30 s lease.
        await eventually(other.try_acquire, timeout=10, what="the other client's acquire")
        print(f"\n{wire}: free for the other client {time.monotonic() - started:.2f} s later")
        assert other.holds()
        other.release()
    finally:
        await direct.aclose()


async def test_a_resent_release_leaves_the_other_clients_lock_alone(
    fault_proxy: FaultProxy,
    fault_redis_server: RedisServer,
    locks: aiolock.LockManager,
    wire: str,
) -> None:
    name = f"{locks.prefix}:rel"
    other = Other(wire, fault_redis_server.url, name)
    lock = locks.lock(name, timeout=5)
    await lock.acquire()
    fault_proxy.blackhole("downstream")
    with pytest.raises(aiolock.LockConnectionError):
        await bounded(lock.release(), 30, "the release")
    assert other.try_acquire(), "the release did not run on Redis"
    fault_proxy.restore()
    await bounded(lock.release(), 30, "the repeated release")  # settled, no error
    assert other.holds(), "aiolock's resent release took the other client's lock"
    other.release()
    await eventually(lambda: locks.statistics().pending_cleanups == 0, what="cleanups")
    assert locks.statistics().held == 0


async def _exists(client: Redis, key: str) -> bool:
    return int(await client.exists(key)) == 1
