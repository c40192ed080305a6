"""Outages and errors (issue 18, items 6-9): an outage is reported as an outage.

* every waiter whose wait ends while Redis is unreachable gets ``LockConnectionError``
  (only the head of a local queue talks to Redis; the others must not report contention);
* the manager logs when Redis becomes unreachable and when it is back;
* ``open()`` checks the server, unless told not to;
* errors that retrying cannot mend (a TLS certificate refused) are raised at once;
* a connection pool too small for the manager is refused when the manager is made.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Iterator

import pytest
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import aiolock
from aiolock.testing import RedisServer

from ._support import bounded, unique_prefix
from .servers import TlsRedisServer, make_tls_material, redis_tls_support

WAITERS = 5


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def _client(url: str) -> Redis:
    # No retries inside redis-py: each attempt fails at once while the server is down.
    return Redis.from_url(url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=2.0)


async def test_every_waiter_of_a_free_name_gets_a_connection_error_during_an_outage(
    own_server: RedisServer,
) -> None:
    """Of 5 tasks waiting on one free name, all get LockConnectionError, none a timeout."""
    client = _client(own_server.url)
    try:
        async with aiolock.LockManager(client, prefix=unique_prefix("outage")) as locks:
            await locks.ping()
            own_server.stop()  # nobody holds the name: only the outage stops the tasks

            async def acquire() -> BaseException | None:
                try:
                    await locks.lock("free").acquire(timeout=2)
                except aiolock.LockError as exc:
                    return exc
                return None

            outcomes = await bounded(
                asyncio.gather(*(acquire() for _ in range(WAITERS))), 30, "the waiters"
            )
            kinds = [type(o).__name__ for o in outcomes]
            assert kinds == ["LockConnectionError"] * WAITERS, outcomes
            assert not any("held by another owner" in str(o) for o in outcomes)
            assert locks.statistics().timeouts == {}
    finally:
        await client.aclose()


async def test_a_timeout_while_redis_answers_still_says_held(own_server: RedisServer) -> None:
    """The outage state clears once an attempt gets through: contention is contention."""
    client = _client(own_server.url)
    try:
        async with aiolock.LockManager(client, prefix=unique_prefix("outage")) as locks:
            own_server.stop()
            with pytest.raises(aiolock.LockConnectionError):
                await locks.lock("other").acquire(timeout=0.3)
            own_server.start()

            async def wait() -> BaseException:
                with pytest.raises(aiolock.LockTimeoutError) as caught:
                    await locks.lock("busy").acquire(timeout=0.5)
                return caught.value

            async with locks.lock("busy"):
                errors = await asyncio.gather(*(asyncio.create_task(wait()) for _ in range(3)))
            assert all("held by another owner" in str(e) for e in errors), errors
    finally:
        await client.aclose()


async def test_an_outage_and_the_recovery_are_logged(
    own_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A waiter with timeout=None against an unreachable Redis: warnings, not silence."""
    client = _client(own_server.url)
    caplog.set_level(logging.WARNING, logger="aiolock")
    try:
        async with aiolock.LockManager(client, prefix=unique_prefix("outage")) as locks:
            own_server.stop()

            async def take() -> None:
                async with locks.lock("x", timeout=None):
                    pass

            waiter = asyncio.create_task(take())
            deadline = time.monotonic() + 20
            while "cannot reach Redis" not in caplog.text and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert f"127.0.0.1:{own_server.port}" in caplog.text
            assert "cannot reach Redis" in caplog.text
            own_server.start()
            await bounded(waiter, 30, "the waiter after Redis came back")
            assert "reaches Redis at" in caplog.text
    finally:
        await client.aclose()
