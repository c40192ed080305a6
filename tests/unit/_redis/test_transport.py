"""The client's transport: replies read without redis-py's per-read timeout, the round-trip
time limits, and the retry after a broken connection (aiolock/_redis/transport.py, _client.py)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from redis import exceptions as rex
from redis._parsers import _AsyncRESP2Parser, _AsyncRESP3Parser
from redis.asyncio import Redis

import aiolock
import aiolock._redis.client
from aiolock._redis.client import Arg, Client
from aiolock._redis.transport import RoundTripTimer, RoundTripTimers, fast_parser
from aiolock.testing import RedisServer


async def _replies(redis: Redis, prefix: str) -> list[Any]:
    """Raw replies, error replies as exception values, of a mix of reply types."""
    client = Client(redis)
    key, hkey = f"{prefix}:s", f"{prefix}:h"
    commands: list[tuple[Arg, ...]] = [
        ("SET", key, "v\u00e9"),
        ("GET", key),
        ("HSET", hkey, "f", 7),
        ("HGET", hkey, "f"),
        ("INCR", key),  # an error reply
        ("HGET", key, "f"),  # WRONGTYPE
        ("EVALSHA", "0" * 40, 0),  # NOSCRIPT
        ("EVAL", "return {1, 'a', {2, redis.call('GET', KEYS[1])}, false}", 1, key),
        ("EVAL", "return redis.error_reply('MINE went wrong')", 0),
        ("GET", f"{prefix}:missing"),
    ]
    replies = await client._exchange(commands, [None] * len(commands))
    await client.aclose()
    return [(type(r), str(r)) if isinstance(r, Exception) else r for r in replies]


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("decode", [False, True])
async def test_replies_match_redis_py_read_response(
    redis_url: str, prefix: str, protocol: int, decode: bool
) -> None:
    """Same values and the same exception classes as redis-py's own reading produces."""
    fast = Redis.from_url(redis_url, protocol=protocol, decode_responses=decode)
    parser = _AsyncRESP3Parser if protocol == 3 else _AsyncRESP2Parser
    slow = Redis.from_url(
        redis_url, protocol=protocol, decode_responses=decode, parser_class=parser
    )
    try:
        got = await _replies(fast, prefix + "f")
        expected = await _replies(slow, prefix + "s")
        conn = await fast.connection_pool.get_connection()  # type: ignore[no-untyped-call]
        assert fast_parser(conn) is not None
        await fast.connection_pool.release(conn)
    finally:
        await fast.aclose()
        await slow.aclose()
    assert got == expected
    errors = [r[0] for r in got if isinstance(r, tuple)]
    assert errors == [rex.ResponseError, rex.ResponseError, rex.NoScriptError, rex.ResponseError]


async def test_redis_defaults_take_the_fast_path(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # redis-py's default since 6.0 (5 s): what made every read costly. Set here so that
    # the oldest supported redis-py, whose default is None, tests the same path.
    redis = Redis.from_url(redis_url, socket_timeout=5)
    try:
        await _fast_path_only(redis, prefix, monkeypatch)
    finally:
        await redis.aclose()


async def _fast_path_only(redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:

    async def slow(*_: object) -> list[Any]:
        raise AssertionError("read_response was used")

    monkeypatch.setattr(Client, "_slow", slow)
    async with aiolock.LockManager(redis, prefix=prefix) as locks:
        async with locks.lock("fast"):
            pass
        await locks.redis.script_flush()  # the NOSCRIPT fallback, through the fast path
        async with locks.lock("fast"):
            pass


async def test_single_connection_clients_use_redis_py(redis_url: str, prefix: str) -> None:
    redis = Redis.from_url(redis_url, single_connection_client=True)
    try:
        async with (
            aiolock.LockManager(redis, prefix=prefix, command_timeout=2) as locks,
            locks.lock("single"),
        ):
            assert await locks.lock("single").locked()
    finally:
        await redis.aclose()


async def test_unix_socket_connections(prefix: str) -> None:
    with RedisServer(["--unixsocket", "redis.sock", "--unixsocketperm", "700"]) as server:
        redis = Redis(unix_socket_path=f"{server.workdir}/redis.sock")
        try:
            async with aiolock.LockManager(redis, prefix=prefix) as locks, locks.lock("unix"):
                assert await locks.lock("unix").locked()
            conn = await redis.connection_pool.get_connection()  # type: ignore[no-untyped-call]
            assert fast_parser(conn) is not None
            await redis.connection_pool.release(conn)
        finally:
            await redis.aclose()


# -- time limits -------------------------------------------------------------------------


async def _unanswered(client: Client, admin: Redis, pause: float = 3.0) -> tuple[str, float]:
    """Send a PING while the server pauses every client; the error and when it came.

    The pause is ten times the callers' 0.3 s timeouts: an error that came only when the
    pause ended (or no error: the answer) cannot pass for a timeout on a loaded machine.
    """
    await client.call("PING")  # a kept connection
    await admin.client_pause(int(pause * 1000), all=True)
    start = time.monotonic()
    try:
        with pytest.raises(aiolock.LockConnectionError) as caught:
            await client.call("PING")
        return str(caught.value), time.monotonic() - start
    finally:
        await admin.client_unpause()  # answered once the pause ends


async def test_socket_timeout_bounds_a_round_trip(redis_url: str, admin: Redis) -> None:
    client = Client(Redis.from_url(redis_url, socket_timeout=0.3))
    try:
        message, took = await _unanswered(client, admin)
        assert "Timeout reading" in message, message
        assert 0.25 < took < 2.0, f"the 0.3 s timeout fired after {took:.2f} s (pause 3 s)"
        assert not client._idle  # a reply may still come on it: never reused
        assert await client.call("PING") == b"PONG"
    finally:
        await client.aclose()
        await client.redis.aclose()


@pytest.mark.parametrize("fast", [True, False])
async def test_command_timeout_bounds_a_round_trip(
    redis_url: str, admin: Redis, fast: bool
) -> None:
    """On the fast path and on the read_response fallback (a pure-Python parser)."""
    options: dict[str, Any] = {} if fast else {"parser_class": _AsyncRESP2Parser}
    client = Client(Redis.from_url(redis_url, socket_timeout=None, **options), command_timeout=0.3)
    try:
        message, took = await _unanswered(client, admin)
        assert "command_timeout" in message, message
        assert 0.25 < took < 2.0, f"the 0.3 s timeout fired after {took:.2f} s (pause 3 s)"
        assert await client.call("PING") == b"PONG"
    finally:
        await client.aclose()
        await client.redis.aclose()


async def test_no_time_limit_arms_no_timer(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_timer(*_: object) -> None:
        raise AssertionError("a round-trip timer was armed")

    monkeypatch.setattr(aiolock._redis.client, "RoundTripTimer", no_timer)
    client = Client(Redis.from_url(redis_url, socket_timeout=None))
    try:
        assert await client.call("PING") == b"PONG"
    finally:
        await client.aclose()
        await client.redis.aclose()


async def test_round_trips_share_one_loop_timer(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: a loop timer per round trip (armed, then cancelled) cost about a dozen
    Python calls of asyncio's each; the round trips of a client share one."""
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counted(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        armed.append(when)
        return call_at(when, callback, *args, **kwargs)

    client = Client(Redis.from_url(redis_url, socket_timeout=5))
    try:
        await client.call("PING")  # connected
        monkeypatch.setattr(loop, "call_at", counted)
        for _ in range(20):
            assert await client.call("PING") == b"PONG"
        assert len(armed) <= 1, armed
    finally:
        monkeypatch.undo()
        await client.aclose()
        await client.redis.aclose()


class _Clock:
    """A loop stand-in for RoundTripTimers: its time is set by the test, and call_at
    records the one armed handle (so the test fires it, not the wall clock)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.armed: list[tuple[float, Any]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any) -> Any:
        entry = (when, callback)
        self.armed.append(entry)
        return SimpleNamespace(cancel=lambda: self.armed.remove(entry))


def test_each_round_trip_expires_at_its_own_deadline() -> None:
    """The shared timer fires at the earliest deadline pending and arms itself again at
    the next one; a round trip answered in time (cancelled) never expires. Driven by a
    clock of the test's, so a loaded machine cannot move what it sees."""
    clock = _Clock()
    timers = RoundTripTimers(clock)  # type: ignore[arg-type]
    conn: Any = SimpleNamespace(_writer=None)
    late = RoundTripTimer(timers, 101.5, conn)
    early = RoundTripTimer(timers, 100.05, conn)  # earlier: the timer moves to it
    answered = RoundTripTimer(timers, 100.02, conn)  # earlier still
    answered.cancel()
    assert [when for when, _ in clock.armed] == [100.02]  # one armed, at the earliest
    clock.now = 100.02
    clock.armed.pop()[1]()  # fires: nothing due (answered was cancelled)
    assert not (early.expired or late.expired or answered.expired)
    assert [when for when, _ in clock.armed] == [100.05]
    clock.now = 100.3
    clock.armed.pop()[1]()
    assert early.expired and not late.expired and not answered.expired
    assert [when for when, _ in clock.armed] == [101.5]
    clock.now = 101.5
    clock.armed.pop()[1]()
    assert late.expired and not answered.expired
    assert timers.armed is None and not timers.pending and not clock.armed


# -- broken connections ------------------------------------------------------------------


async def test_a_broken_connection_is_retried_on_a_pool_connection_not_a_kept_one(
    redis: Redis, admin: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 7, defect 9: the kept connections died together (server restart, proxy drop);
    retrying on another of them failed the same way."""
    client = Client(redis)
    pool = redis.connection_pool
    kept = [await pool.get_connection() for _ in range(3)]  # type: ignore[no-untyped-call]
    for conn in kept:
        await conn.send_command("CLIENT", "ID")
        conn_id = await conn.read_response()
        await admin.client_kill_filter(_id=conn_id)
    client._idle.extend(kept)
    # as if the server's FIN had not arrived yet: the kept connections look usable
    monkeypatch.setattr(aiolock._redis.client, "_usable", lambda _: True)
    try:
        assert await client.call("PING") == b"PONG"
        assert len(client._idle) == 1  # the dead ones were dropped, the fresh one kept
    finally:
        await client.aclose()


async def test_a_kept_connection_the_server_closed_is_not_used(
    redis: Redis, admin: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = Client(redis)
    assert await client.call("PING") == b"PONG"
    (conn,) = client._idle
    await conn.send_command("CLIENT", "ID")
    await admin.client_kill_filter(_id=await conn.read_response())

    async def no_retry(*_: object) -> None:
        raise AssertionError("the closed connection was written to")

    monkeypatch.setattr(Client, "_drop_idle", no_retry)
    try:
        assert await client.call("PING") == b"PONG"
    finally:
        await client.aclose()
