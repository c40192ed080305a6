"""A loopback TCP proxy that a test controls, for putting network faults between a client
and a ``redis-server``.

>>> async with FaultProxy("127.0.0.1", server.port) as proxy:     # doctest: +SKIP
...     client = Redis.from_url(proxy.url, socket_timeout=0.5)
...     proxy.set_latency(0.2)      # every chunk waits 200 ms, in both directions
...     proxy.set_latency(0.3, "upstream")  # commands wait 300 ms, replies as before
...     proxy.hold_back(b"EVALSHA", 0.3)    # only chunks with these bytes wait (upstream)
...     proxy.blackhole()           # bytes are read and thrown away; sockets stay open
...     proxy.restore()             # forward again (no latency change)
...     proxy.drop_all()            # RST every current connection, both sides
...     proxy.refuse(True)          # new connections are reset as soon as accepted

The proxy forwards opaque bytes, so it also works in front of a TLS server (use
``scheme="rediss"`` for :attr:`FaultProxy.url`). Faults apply at chunk granularity: a
chunk is whatever one ``read()`` returned (at most 64 KiB).

Every connection runs four small tasks (a reader and a sender per direction); they end
when either peer closes, on :meth:`FaultProxy.drop_all` or on :meth:`FaultProxy.stop`,
which waits for them for a bounded time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import random
import socket
import struct
from types import TracebackType
from typing import Any, Literal

__all__ = ["Direction", "FaultProxy", "ProxyStats"]

_CHUNK = 64 * 1024
_STOP_GRACE = 5.0  # seconds stop() waits for connection tasks after cancelling them

#: ``"upstream"`` is client -> server (commands), ``"downstream"`` is server -> client
#: (replies), ``"both"`` is both.
Direction = Literal["upstream", "downstream", "both"]


class _Way(enum.Enum):
    UP = "upstream"
    DOWN = "downstream"


def _ways(direction: Direction) -> tuple[_Way, ...]:
    if direction == "both":
        return (_Way.UP, _Way.DOWN)
    if direction == "upstream":
        return (_Way.UP,)
    if direction == "downstream":
        return (_Way.DOWN,)
    raise ValueError(f"direction must be 'upstream', 'downstream' or 'both', not {direction!r}")


@dataclasses.dataclass(frozen=True)
class ProxyStats:
    """A snapshot of a :class:`FaultProxy`'s counters."""

    #: connections accepted and forwarded (refused ones are not counted here)
    connections_accepted: int
    #: connections reset on accept while :meth:`FaultProxy.refuse` was on
    connections_refused: int
    #: connections accepted whose upstream connect failed
    upstream_connect_failures: int
    #: connections currently open
    connections_active: int
    #: connections closed by :meth:`FaultProxy.drop_all`
    connections_dropped: int
    #: bytes delivered client -> server
    bytes_upstream: int
    #: bytes delivered server -> client
    bytes_downstream: int
    #: bytes read client -> server and thrown away by a blackhole
    bytes_blackholed_upstream: int
    #: bytes read server -> client and thrown away by a blackhole
    bytes_blackholed_downstream: int


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close a connection abruptly: SO_LINGER 0 turns the close into a TCP RST."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    """One client connection and its upstream connection."""

    def __init__(
        self,
        proxy: FaultProxy,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        upstream_reader: asyncio.StreamReader,
        upstream_writer: asyncio.StreamWriter,
    ) -> None:
        self.proxy = proxy
        self.client_writer = client_writer
        self.upstream_writer = upstream_writer
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False
        #: chunks read from either peer and not yet sent on (or thrown away)
        self.pending = 0
        for way, reader, writer in (
            (_Way.UP, client_reader, upstream_writer),
            (_Way.DOWN, upstream_reader, client_writer),
        ):
            queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
            self.tasks.append(asyncio.create_task(self._read(way, reader, queue)))
            self.tasks.append(asyncio.create_task(self._send(way, writer, queue)))

    async def _read(
        self,
        way: _Way,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes] | None],
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:  # ends at EOF, on a socket error or on cancellation
                data = await reader.read(_CHUNK)
                if not data:
                    # A blackhole also swallows the FIN: hold it until restore().
                    await self.proxy._forwarding[way].wait()
                    queue.put_nowait(None)
                    return
                if not self.proxy._forwarding[way].is_set():
                    self.proxy._count_blackholed(way, len(data))
                    continue
                self.pending += 1
                delay = self.proxy._delay(self, way)
                if way is _Way.UP:
                    delay += self.proxy._held_back(data)
                queue.put_nowait((loop.time() + delay, data))
        except (ConnectionError, OSError):
            self.abort()

    async def _send(
        self,
        way: _Way,
        writer: asyncio.StreamWriter,
        queue: asyncio.Queue[tuple[float, bytes] | None],
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:  # ends at EOF, on a socket error or on cancellation
                item = await queue.get()
                if item is None:
                    if writer.can_write_eof():
                        writer.write_eof()
                    self._half_closed()
                    return
                due, data = item
                try:
                    delay = due - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    if not self.proxy._forwarding[way].is_set():
                        # Blackholed while the chunk was in flight: it is lost too.
                        self.proxy._count_blackholed(way, len(data))
                        continue
                    writer.write(data)
                    await writer.drain()
                    self.proxy._count_delivered(way, len(data))
                finally:
                    self.pending -= 1
        except (ConnectionError, OSError):
            self.abort()

    def _half_closed(self) -> None:
        """Once both directions have delivered their EOF, close both sockets."""
        done = sum(1 for task in self.tasks[1::2] if task.done())
        # the calling sender task is not done yet, so one finished sender means both
        if done >= 1:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for writer in (self.client_writer, self.upstream_writer):
            writer.close()
        self.proxy._forget(self)

    def abort(self) -> None:
        """Reset both sockets (TCP RST) and stop this connection's tasks."""
        if self.closed:
            return
        self.closed = True
        for writer in (self.client_writer, self.upstream_writer):
            _abort(writer)
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        self.proxy._forget(self)


class FaultProxy:
    """An asyncio TCP proxy on 127.0.0.1 between a client and ``upstream_host:upstream_port``.

    Args:
        upstream_host: where to forward to; must be a loopback address.
        upstream_port: the upstream port (e.g. ``RedisServer.port``).
        port: the port to listen on (default: a free one, see :attr:`port`).
        scheme: the URL scheme :attr:`url` uses (``"rediss"`` in front of a TLS server).
        connect_timeout: seconds allowed for each upstream connect.
        seed: seeds the draws of the jitter (:meth:`set_latency`), for a repeatable run.

    Use it as ``async with FaultProxy(...) as proxy:`` or call :meth:`start` and
    :meth:`stop`. The controls are plain methods, safe to call from the event loop at any
    time; they affect current and future connections.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        port: int = 0,
        scheme: str = "redis",
        connect_timeout: float = 5.0,
        seed: int | None = None,
    ) -> None:
        if upstream_host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"FaultProxy only forwards to loopback, not {upstream_host!r}")
        self.host = "127.0.0.1"
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.scheme = scheme
        self.connect_timeout = connect_timeout
        #: seconds each chunk read from now on waits, per direction (see set_latency)
        self._latency = {_Way.UP: 0.0, _Way.DOWN: 0.0}
        #: upstream chunks containing a key wait its seconds more (see hold_back)
        self._holds: dict[bytes, float] = {}
        self._chunks_held_back = 0
        #: at most this many seconds more, drawn per chunk (see :meth:`set_latency`)
        self.jitter = 0.0
        self._rng = random.Random(seed)
        #: the connections slowed by set_latency(existing_only=True); None: all
        self._slowed: set[_Connection] | None = None
        self._port = port
        self._server: asyncio.Server | None = None
        self._refusing = False
        self._connections: set[_Connection] = set()
        self._pending: set[asyncio.Task[Any]] = set()
        self._forwarding: dict[_Way, asyncio.Event] = {}
        self._accepted = 0
        self._refused = 0
        self._connect_failures = 0
        self._dropped = 0
        self._delivered = {_Way.UP: 0, _Way.DOWN: 0}
        self._blackholed = {_Way.UP: 0, _Way.DOWN: 0}

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> FaultProxy:
        """Start listening; idempotent."""
        if self._server is not None:
            return self
        if not self._forwarding:
            self._forwarding = {way: asyncio.Event() for way in _Way}
            for event in self._forwarding.values():
                event.set()
        self._server = await asyncio.start_server(self._on_accept, self.host, self._port)
        self._port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def stop(self) -> None:
        """Stop listening, reset every open connection and wait (bounded) for its tasks."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks: list[asyncio.Task[Any]] = list(self._pending)
        for conn in list(self._connections):
            tasks.extend(conn.tasks)
            conn.abort()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_STOP_GRACE)
        if server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), _STOP_GRACE)

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """The port the proxy listens on (known once started)."""
        if self._server is None and self._port == 0:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` (or ``rediss://`` with ``scheme="rediss"``)."""
        return f"{self.scheme}://{self.host}:{self.port}/0"

    # -- controls -------------------------------------------------------------------------

    def set_latency(
        self,
        seconds: float,
        direction: Direction = "both",
        *,
        jitter: float = 0.0,
        existing_only: bool = False,
    ) -> None:
        """Delay every chunk read from now on by *seconds*, in *direction* (both by default;
        the other direction keeps its own latency), plus a random extra of up to *jitter*
        seconds drawn per chunk.

        Order is kept within a connection and throughput is not throttled: a chunk waits
        its delay after it was read, not after the previous chunk was sent. ``0`` removes
        the delay. A chunk keeps the delay it was read with: setting the latency back to 0
        right after a command was read delays that command alone, while a command sent
        afterwards on another connection overtakes it (each connection has its own queue).
        With *jitter*, chunks of different connections may overtake each other, as on a
        network whose paths differ. With *existing_only*, only the connections open now are
        slowed (a slow flow: one connection retransmitting while new ones go through).
        """
        if seconds < 0 or jitter < 0:
            raise ValueError("latency and jitter must be >= 0")
        for way in _ways(direction):
            self._latency[way] = float(seconds)
        self.jitter = float(jitter)
        self._slowed = set(self._connections) if existing_only else None

    def hold_back(self, pattern: bytes, seconds: float) -> None:
        """Delay by *seconds* more each client -> server chunk read from now on that
        contains *pattern* (a script's SHA1, a key): one kind of command is held back,
        the rest (a connection's handshake, other scripts) is not. ``0`` ends it."""
        if seconds < 0:
            raise ValueError("hold_back seconds must be >= 0")
        if seconds == 0:
            self._holds.pop(pattern, None)
        else:
            self._holds[pattern] = float(seconds)

    @property
    def chunks_held_back(self) -> int:
        """How many chunks :meth:`hold_back` has delayed so far."""
        return self._chunks_held_back

    def _held_back(self, data: bytes) -> float:
        extra = max((s for p, s in self._holds.items() if p in data), default=0.0)
        if extra:
            self._chunks_held_back += 1
        return extra

    @property
    def latency(self) -> float:
        """The larger of the two directions' latencies, in seconds."""
        return max(self._latency.values())

    def blackhole(self, direction: Direction = "both") -> None:
        """Stop forwarding: bytes read (and in flight) are thrown away, FINs are held back,
        and every socket stays open, so the peer sees silence rather than an error.

        ``direction="downstream"`` lets commands reach and run on the server while their
        replies are lost; ``"upstream"`` loses the commands themselves.
        """
        for way in _ways(direction):
            self._event(way).clear()

    def restore(self) -> None:
        """Forward again in both directions (a latency set earlier stays)."""
        for way in _Way:
            self._event(way).set()

    def drop_all(self) -> int:
        """Reset (TCP RST) every current connection on both sides; return how many."""
        conns = list(self._connections)
        for conn in conns:
            conn.abort()
        self._dropped += len(conns)
        return len(conns)

    def refuse(self, refusing: bool = True) -> None:
        """While on, every new connection is reset as soon as it is accepted (the client's
        connect succeeds, its first read or write fails); existing ones are untouched."""
        self._refusing = bool(refusing)

    @property
    def in_flight(self) -> int:
        """Chunks read and not yet sent on, over the open connections: 0 once every
        delayed command (or reply) has been delivered."""
        return sum(conn.pending for conn in self._connections)

    @property
    def blackholed(self) -> bool:
        """True while either direction is blackholed."""
        return any(not event.is_set() for event in self._forwarding.values())

    @property
    def stats(self) -> ProxyStats:
        return ProxyStats(
            connections_accepted=self._accepted,
            connections_refused=self._refused,
            upstream_connect_failures=self._connect_failures,
            connections_active=len(self._connections),
            connections_dropped=self._dropped,
            bytes_upstream=self._delivered[_Way.UP],
            bytes_downstream=self._delivered[_Way.DOWN],
            bytes_blackholed_upstream=self._blackholed[_Way.UP],
            bytes_blackholed_downstream=self._blackholed[_Way.DOWN],
        )

    # shorthands for the most used counters
    @property
    def connections_accepted(self) -> int:
        return self._accepted

    @property
    def bytes_upstream(self) -> int:
        return self._delivered[_Way.UP]

    @property
    def bytes_downstream(self) -> int:
        return self._delivered[_Way.DOWN]

    def __repr__(self) -> str:
        return (
            f"<FaultProxy 127.0.0.1:{self._port} -> {self.upstream_host}:{self.upstream_port}"
            f" latency={self.latency} blackholed={self.blackholed} refusing={self._refusing}>"
        )

    # -- internals ------------------------------------------------------------------------

    def _event(self, way: _Way) -> asyncio.Event:
        if not self._forwarding:
            raise RuntimeError("the proxy is not started")
        return self._forwarding[way]

    def _count_delivered(self, way: _Way, n: int) -> None:
        self._delivered[way] += n

    def _count_blackholed(self, way: _Way, n: int) -> None:
        self._blackholed[way] += n

    def _delay(self, conn: _Connection, way: _Way) -> float:
        if self._slowed is not None and conn not in self._slowed:
            return 0.0
        if self.jitter == 0.0:
            return self._latency[way]
        return self._latency[way] + self._rng.uniform(0.0, self.jitter)

    def _forget(self, conn: _Connection) -> None:
        self._connections.discard(conn)

    async def _on_accept(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        if self._refusing or self._server is None:
            self._refused += 1
            _abort(client_writer)
            return
        task = asyncio.current_task()
        assert task is not None
        self._pending.add(task)
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(self.upstream_host, self.upstream_port),
                self.connect_timeout,
            )
        except (OSError, asyncio.TimeoutError):
            self._connect_failures += 1
            _abort(client_writer)
            return
        finally:
            self._pending.discard(task)
        if self._server is None:  # stopped while connecting
            _abort(client_writer)
            _abort(upstream_writer)
            return
        self._accepted += 1
        conn = _Connection(self, client_reader, client_writer, upstream_reader, upstream_writer)
        self._connections.add(conn)
