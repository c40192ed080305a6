"""FaultProxy against a real redis-server and a plain redis.asyncio client."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.exceptions
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from aiolock.testing import RedisServer
from tests._support.faults import eventually
from tests._support.proxy import _CHUNK, FaultProxy


def no_retry(url: str, **kwargs: Any) -> Redis:
    """A client that surfaces every failure: redis-py >= 6 retries 3 times by default."""
    return Redis.from_url(url, retry=Retry(NoBackoff(), 0), **kwargs)


@pytest.fixture
async def client_factory() -> AsyncIterator[Callable[..., Redis]]:
    made: list[Redis] = []

    def make(url: str, **kwargs: Any) -> Redis:
        client = no_retry(url, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


async def timed_ping(client: Redis) -> float:
    start = time.perf_counter()
    assert await client.ping()
    return time.perf_counter() - start


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll *predicate* every 10 ms, for at most *timeout* seconds."""
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


async def test_forwards_and_counts(
    fault_proxy: FaultProxy, client_factory: Callable[..., Redis]
) -> None:
    client = client_factory(fault_proxy.url)
    key = f"proxy-{uuid.uuid4().hex}"
    assert await client.set(key, b"v" * 1000)
    assert await client.get(key) == b"v" * 1000
    stats = fault_proxy.stats
    assert stats.connections_accepted == 1
    assert stats.connections_active == 1
    assert stats.bytes_upstream > 1000  # the SET carried the value up
    assert stats.bytes_downstream > 1000  # the GET carried it down
    assert fault_proxy.url == f"redis://127.0.0.1:{fault_proxy.port}/0"
    await client.aclose()
    await wait_for(lambda: fault_proxy.stats.connections_active == 0)


async def test_latency_delays_each_direction(
    fault_proxy: FaultProxy, client_factory: Callable[..., Redis]
) -> None:
    client = client_factory(fault_proxy.url)
    # Without latency a ping takes a millisecond; the bound is the 0.3 s the latency below
    # costs (the best of three: a loaded machine can hold up one ping for a while).
    baseline = min([await timed_ping(client) for _ in range(3)])
    assert baseline < 0.3
    fault_proxy.set_latency(0.15)
    delayed = await timed_ping(client)
    # 0.15 up + 0.15 down: the lower bound is what this proves (both ways are delayed);
    # the upper one only catches a stall, with room for a loaded machine
    assert 0.3 <= delayed < 0.3 + 1.0, f"the delayed ping took {delayed:.2f} s"
    fault_proxy.set_latency(0)
    assert min([await timed_ping(client) for _ in range(3)]) < 0.3


async def test_latency_of_one_direction_delays_one_command_alone(
    fault_proxy: FaultProxy, client_factory: Callable[..., Redis]
) -> None:
    slow, fast = client_factory(fault_proxy.url), client_factory(fault_proxy.url)
    assert await slow.ping() and await fast.ping()  # both connected before the delay
    key = f"proxy-{uuid.uuid4().hex}"
    fault_proxy.set_latency(0.3, "upstream")
    assert fault_proxy.latency == 0.3
    late = asyncio.ensure_future(slow.set(key, "late"))
    # The proxy read the SET with the latency (a loopback write is read within the loop's
    # next steps); setting it back delays nothing read afterwards.
    await asyncio.sleep(0.05)
    fault_proxy.set_latency(0, "upstream")
    assert await fast.set(key, "early")  # on another connection: it overtakes the SET
    assert await fast.get(key) == b"early"
    assert fault_proxy.in_flight == 1  # the SET, still held back
    assert await late
    await wait_for(lambda: fault_proxy.in_flight == 0)
    assert await fast.get(key) == b"late"
    # The replies' direction was never delayed: a ping is quick again.
    assert min([await timed_ping(slow) for _ in range(3)]) < 0.3
    with pytest.raises(ValueError, match="direction"):
        fault_proxy.set_latency(0.1, "sideways")  # type: ignore[arg-type]


async def test_hold_back_delays_the_matching_commands_alone(
    fault_proxy: FaultProxy, client_factory: Callable[..., Redis]
) -> None:
    slow, fast = client_factory(fault_proxy.url), client_factory(fault_proxy.url)
    assert await slow.ping() and await fast.ping()
    key = f"proxy-{uuid.uuid4().hex}"
    fault_proxy.hold_back(b"held-value", 0.3)
    late = asyncio.ensure_future(slow.set(key, "held-value"))
    await wait_for(lambda: fault_proxy.chunks_held_back == 1)
    fault_proxy.hold_back(b"held-value", 0)
    assert await fast.set(key, "early")  # not held back: it overtakes the first SET
    assert await fast.get(key) == b"early"
    assert await late
    assert await fast.get(key) == b"held-value"
    assert fault_proxy.chunks_held_back == 1


async def test_latency_keeps_order_and_throughput(
    fault_proxy: FaultProxy, client_factory: Callable[..., Redis]
) -> None:
    client = client_factory(fault_proxy.url)
    assert await client.ping()  # connected before the latency: the pipeline's time only
    key = f"proxy-{uuid.uuid4().hex}"
    latency = 0.25
    fault_proxy.set_latency(latency)
    before = fault_proxy.stats
    padding = "x" * 4000  # 200 of them are several of the proxy's chunks each way
    start = time.perf_counter()
    async with client.pipeline(transaction=False) as pipe:
        for i in range(200):
            pipe.rpush(key, f"{i}:{padding}")
        pipe.lrange(key, 0, -1)
        results = await pipe.execute()
    elapsed = time.perf_counter() - start
    assert [int(x.split(b":")[0]) for x in results[-1]] == list(range(200))
    # Every chunk waits its latency from the moment it was read, so chunks in flight
    # overlap: the whole pipeline costs one delayed round trip (2 * latency). A proxy
    # that delayed each chunk after the one before would cost at least one latency per
    # chunk: the proxy reads at most _CHUNK bytes at a time, so at least this many.
    after = fault_proxy.stats
    chunks = math.ceil((after.bytes_upstream - before.bytes_upstream) / _CHUNK) + math.ceil(
        (after.bytes_downstream - before.bytes_downstream) / _CHUNK
    )
    serial = chunks * latency
    assert chunks >= 20, chunks
    assert 2 * latency <= elapsed < serial / 2, (
        f"the pipeline took {elapsed:.2f} s: one round trip is {2 * latency:.2f} s, "
        f"a latency per chunk ({chunks} chunks) at least {serial:.2f} s"
    )


async def test_blackhole_times_out_then_restore_recovers(
    fault_proxy: FaultProxy, client_factory: Callable[..., Redis]
) -> None:
    client = client_factory(fault_proxy.url, socket_timeout=0.3)
    assert await client.ping()
    fault_proxy.blackhole()
    assert fault_proxy.blackholed
    start = time.perf_counter()
    with pytest.raises(redis.exceptions.TimeoutError):
        await client.ping()
    took = time.perf_counter() - start
    # the 0.3 s socket_timeout, not redis-py's retries or a hang
    assert 0.25 <= took < 3.0, f"the blackholed ping timed out after {took:.2f} s"
    # the proxy kept its sockets: no error reached the client, only silence
    assert fault_proxy.stats.connections_active >= 1
    assert fault_proxy.stats.bytes_blackholed_upstream > 0
    fault_proxy.restore()
    assert await client.ping()  # redis-py reconnects after the timeout


async def test_blackhole_downstream_runs_command_but_loses_reply(
    fault_proxy: FaultProxy,
    fault_redis_server: RedisServer,
    client_factory: Callable[..., Redis],
) -> None:
    client = client_factory(fault_proxy.url, socket_timeout=0.3)
    direct = client_factory(fault_redis_server.url)
    key = f"proxy-{uuid.uuid4().hex}"
    assert await client.ping()
    fault_proxy.blackhole("downstream")
    with pytest.raises(redis.exceptions.TimeoutError):
        await client.set(key, "written")
    assert await direct.get(key) == b"written"  # it ran; only the reply was lost
    assert fault_proxy.stats.bytes_blackholed_downstream > 0
    fault_proxy.restore()
    assert await client.get(key) == b"written"


async def test_drop_all_resets_connections(
    fault_proxy: FaultProxy, client_factory: Callable[..., Redis]
) -> None:
    client = client_factory(fault_proxy.url, socket_timeout=2.0)
    assert await client.ping()
    fault_proxy.set_latency(0.5)  # keep the next PING in flight while we drop
    sent = fault_proxy.stats.bytes_upstream
    in_flight = asyncio.ensure_future(client.ping())
    # the PING reached the server; its answer is now 0.5 s on its way back
    await eventually(lambda: fault_proxy.stats.bytes_upstream > sent, what="the PING sent")
    assert fault_proxy.drop_all() == 1
    assert fault_proxy.stats.connections_active == 0
    with pytest.raises(redis.exceptions.ConnectionError):
        await in_flight
    fault_proxy.set_latency(0)
    assert await client.ping()  # a fresh connection works
    assert fault_proxy.stats.connections_accepted == 2
    assert fault_proxy.stats.connections_dropped == 1


async def test_refuse_new_connections_only(
    fault_proxy: FaultProxy, client_factory: Callable[..., Redis]
) -> None:
    existing = client_factory(fault_proxy.url, socket_timeout=2.0)
    assert await existing.ping()
    fault_proxy.refuse(True)
    newcomer = client_factory(fault_proxy.url, socket_timeout=2.0, socket_connect_timeout=2.0)
    with pytest.raises(redis.exceptions.ConnectionError):
        await newcomer.ping()
    assert fault_proxy.stats.connections_refused >= 1
    assert await existing.ping()  # the open connection is untouched
    fault_proxy.refuse(False)
    assert await newcomer.ping()


async def test_upstream_down_and_back(client_factory: Callable[..., Redis]) -> None:
    with RedisServer() as server:
        async with FaultProxy(server.host, server.port) as proxy:
            client = client_factory(proxy.url, socket_timeout=2.0)
            assert await client.ping()
            await asyncio.to_thread(server.restart)  # same port, new process
            with pytest.raises(redis.exceptions.ConnectionError):
                await client.ping()  # the old upstream connection died
            assert await client.ping()
            server.stop()
            for _ in range(2):  # the stale connection, then a connect through the proxy
                with pytest.raises(redis.exceptions.ConnectionError):
                    await client.ping()
            await wait_for(lambda: proxy.stats.upstream_connect_failures >= 1)


async def test_stop_closes_everything(client_factory: Callable[..., Redis]) -> None:
    with RedisServer() as server:
        proxy = await FaultProxy(server.host, server.port).start()
        client = client_factory(proxy.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        assert await client.ping()
        proxy.blackhole()
        await proxy.stop()
        assert proxy.stats.connections_active == 0
        with pytest.raises(redis.exceptions.ConnectionError):
            await client.ping()


def test_only_loopback_upstreams() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("10.0.0.1", 1234)
