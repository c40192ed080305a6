"""Reachability: the outcome of the latest round trip, and the probe of a wait that ends
before any attempt for its lock was answered."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._redis.reach import PROBE_FRESH, Reachability, describe, endpoint, speaks_plain


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that nothing listens on (bound, never listening: refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_the_endpoint_is_the_clients_one_address(redis_url: str) -> None:
    url = urlparse(redis_url)
    assert endpoint(Redis.from_url(redis_url)) == (url.hostname, url.port)
    assert endpoint(Redis(unix_socket_path="/tmp/some.sock")) == "/tmp/some.sock"
    assert endpoint(object()) is None  # nothing to connect to: it never probes


async def test_a_refused_connection_is_an_outage_that_every_waiter_then_reports(
    closed_port: int,
) -> None:
    reach = Reachability(f"127.0.0.1:{closed_port}", ("127.0.0.1", closed_port))
    failure = await reach.probe()
    assert isinstance(failure, aiolock.LockConnectionError)
    assert f"127.0.0.1:{closed_port}" in str(failure)
    assert reach.failure is failure  # recorded: logged, and reported until reached()
    error = reach.unreachable_error("lock 'a'", 2.0, failure)
    assert "this is an outage, not contention" in str(error)
    reach.reached()
    assert reach.failure is None


async def test_a_server_that_accepts_is_not_an_outage(redis_url: str) -> None:
    url = urlparse(redis_url)
    assert url.hostname is not None and url.port is not None
    reach = Reachability(describe(Redis.from_url(redis_url)), (url.hostname, url.port))
    assert await reach.probe() is None
    assert reach.failure is None


async def test_no_endpoint_no_probe() -> None:
    assert await Reachability("the primary of Sentinel service 'x'").probe() is None


async def test_waits_that_end_together_share_one_probe(closed_port: int) -> None:
    reach = Reachability("x", ("127.0.0.1", closed_port))
    connects = 0
    real = reach._connect

    async def counted(target: tuple[str, int] | str) -> aiolock.LockConnectionError | None:
        nonlocal connects
        connects += 1
        return await real(target)

    reach._connect = counted  # type: ignore[method-assign]
    first = await asyncio.gather(*(reach.probe() for _ in range(10)))
    assert all(isinstance(f, aiolock.LockConnectionError) for f in first)
    assert connects == 1
    reach.failure = None  # (as if the failure had not been recorded)
    assert await reach.probe() is not None and connects == 1  # fresh: asked once
    reach.failure = None
    reach._probed_at -= PROBE_FRESH + 0.1  # stale: the next wait asks again
    assert await reach.probe() is not None and connects == 2
    reach.reached()  # an attempt got through: a refusal seen before it is out of date
    assert await reach.probe() is not None and connects == 3


async def test_a_listener_that_closes_without_answering_is_an_outage() -> None:
    """A proxy or balancer in front of a stopped server accepts, then closes at once."""

    async def close_at_once(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        pinging = Reachability("x", ("127.0.0.1", port), ping=True)
        failure = await pinging.probe()
        assert isinstance(failure, aiolock.LockConnectionError)
        # (closed, or reset: which one the PING meets depends on timing)
        assert "closed without an answer" in str(failure) or "reset" in str(failure)
        # Without PING (a TLS port: a plain PING would be refused there) it opened: no
        # outage is claimed.
        assert await Reachability("x", ("127.0.0.1", port)).probe() is None
    finally:
        server.close()
        await server.wait_closed()


async def test_a_paused_server_is_not_an_outage(redis_url: str) -> None:
    url = urlparse(redis_url)
    assert url.hostname is not None and url.port is not None
    admin = Redis.from_url(redis_url)
    try:
        await admin.execute_command("CLIENT", "PAUSE", 1000, "ALL")  # type: ignore[no-untyped-call]
        reach = Reachability("x", (url.hostname, url.port), ping=True)
        assert await reach.probe() is None  # opened, no answer yet: nothing learned
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")  # type: ignore[no-untyped-call]
        await admin.aclose()


def test_a_tls_client_is_not_pinged(redis_url: str) -> None:
    assert speaks_plain(Redis.from_url(redis_url))
    assert not speaks_plain(Redis.from_url(redis_url.replace("redis://", "rediss://")))
