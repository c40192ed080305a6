"""The client's transport over TLS and through network faults (aiolock/_redis/transport.py)."""

from __future__ import annotations

import time

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._redis.client import Client
from aiolock._redis.transport import fast_parser
from tests._support.proxy import FaultProxy
from tests._support.servers import TlsRedisServer


async def _through_blackhole(client: Client, proxy: FaultProxy) -> tuple[str, float]:
    assert await client.call("PING") == b"PONG"
    (conn,) = client._idle
    assert fast_parser(conn) is not None
    proxy.blackhole()
    start = time.monotonic()
    with pytest.raises(aiolock.LockConnectionError) as caught:
        await client.call("PING")
    took = time.monotonic() - start
    proxy.restore()
    assert not client._idle  # the timed-out connection was aborted, not kept
    assert await client.call("PING") == b"PONG"
    return str(caught.value), took


async def test_tls_locks_and_socket_timeout(tls_redis: TlsRedisServer) -> None:
    """The round-trip timer aborts an SSL transport as it does a plain one."""
    async with FaultProxy(tls_redis.host, tls_redis.port, scheme="rediss") as proxy:
        redis = Redis.from_url(proxy.url, ssl_ca_certs=tls_redis.ca_path, socket_timeout=0.4)
        client = Client(redis)
        try:
            async with (
                aiolock.LockManager(redis, prefix="transport-tls") as locks,
                locks.lock("tls"),
            ):
                assert await locks.lock("tls").locked()
            message, took = await _through_blackhole(client, proxy)
            assert "Timeout reading" in message, message
            # 0.4 s, not a hang; the upper bound leaves a loaded machine its seconds
            assert 0.35 < took < 3.0, f"the 0.4 s socket_timeout fired after {took:.2f} s"
        finally:
            await client.aclose()
            await redis.aclose()


async def test_command_timeout_through_a_blackhole(fault_proxy: FaultProxy) -> None:
    # A socket_timeout far above the bound below (redis-py's default is 5 s): only the
    # command_timeout can end the round trip in time, on a loaded machine too.
    redis = Redis.from_url(fault_proxy.url, socket_timeout=30)
    client = Client(redis, command_timeout=0.3)
    try:
        message, took = await _through_blackhole(client, fault_proxy)
        assert "command_timeout" in message, message
        # 0.3 s, not the 30 s socket_timeout nor a hang
        assert 0.25 < took < 3.0, f"the 0.3 s command_timeout fired after {took:.2f} s"
    finally:
        await client.aclose()
        await redis.aclose()


async def test_dropped_connections_are_replaced(fault_proxy: FaultProxy) -> None:
    """All kept connections reset at once (a proxy or a server restart): the next round trip
    still succeeds, on a new connection."""
    redis = Redis.from_url(fault_proxy.url)
    client = Client(redis)
    try:
        await client.call("PING")
        fault_proxy.drop_all()
        assert await client.call("PING") == b"PONG"
    finally:
        await client.aclose()
        await redis.aclose()
