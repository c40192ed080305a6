"""Whether the manager can reach Redis, as its latest round trips found, and the log of it.

Only the head of a lock's local queue talks to Redis (see :mod:`aiolock._engine.engine`), so
the other waiters never see a connection failure themselves. The engine records each
attempt's outcome here; a waiter whose wait ends while the last attempt failed on a
connection error then reports the outage (:class:`~aiolock.LockConnectionError`), not
contention. The transitions are logged (rate-limited), so an outage is never silent,
even for waiters that wait without a timeout.

A head's attempt may also still be out when waits end: redis-py retries a refused
connection inside one command (its default retry takes seconds), so no attempt has
failed yet. A wait that ends unanswered then asks the server's address directly
(:meth:`Reachability.probe`): a connection refused there is the outage the waiter
reports; one that opens is a slow or paused server, which stays a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import anyio

from aiolock._errors import LockConnectionError, LockTimeoutError
from aiolock._redis.client import POOL_EXHAUSTED

__all__ = [
    "LOG_INTERVAL",
    "PROBE_FRESH",
    "PROBE_LIMIT",
    "Reachability",
    "describe",
    "endpoint",
    "speaks_plain",
]

logger = logging.getLogger("aiolock")

#: At most one "cannot reach" warning per this many seconds (a flapping link or a long
#: outage would otherwise log on every retry of every waiter).
LOG_INTERVAL = 30.0

#: Seconds a probe's connection may take to open or be refused. A refusal comes back in
#: one round trip; a connection that neither opens nor fails in this time says nothing
#: (a server far away, or a network that drops packets): the wait stays a timeout.
PROBE_LIMIT = 0.25

#: Seconds a probe's answer stands for every wait that ends meanwhile (one probe per
#: manager at a time, however many waits end together).
PROBE_FRESH = 1.0

#: A wait that ends with no attempt for its lock answered in this many seconds (or in the
#: whole wait, if shorter) probes: Redis may have stopped since it last answered.
QUIET_LIMIT = 1.0

#: Where a probe connects: (host, port), or a unix socket's path.
Endpoint = tuple[str, int] | str


def describe(redis: Any) -> str:
    """The address of a redis-py client's server, for log lines and errors."""
    pool = getattr(redis, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if isinstance(service, str):
        return f"the primary of Sentinel service {service!r}"
    kwargs = getattr(pool, "connection_kwargs", None)
    if isinstance(kwargs, dict):
        if kwargs.get("path"):
            return f"unix socket {kwargs['path']}"
        return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    nodes = getattr(redis, "startup_nodes", None)  # a RedisCluster
    if isinstance(nodes, list) and nodes:
        return "Redis Cluster node " + ", ".join(getattr(n, "name", "?") for n in nodes[:3])
    return "Redis"


def endpoint(redis: Any) -> Endpoint | None:
    """Where a probe of a redis-py client's one server connects, if it has one address.

    None for a Sentinel service or a Cluster (their address changes with failovers, and
    their own clients already report a node that refuses connections).
    """
    pool = getattr(redis, "connection_pool", None)
    if isinstance(getattr(pool, "service_name", None), str):
        return None
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return None
    if kwargs.get("path"):
        return str(kwargs["path"])
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    if isinstance(host, str) and isinstance(port, int):
        return host, port
    return None


def speaks_plain(redis: Any) -> bool:
    """Whether a redis-py client's connections are plain TCP or a unix socket (not TLS)."""
    pool = getattr(redis, "connection_pool", None)
    kind = getattr(pool, "connection_class", None)
    return isinstance(kind, type) and "SSL" not in kind.__name__


class Reachability:
    """The outcome of the manager's latest round trip to Redis: reached, or why not."""

    def __init__(self, address: str, target: Endpoint | None = None, ping: bool = False) -> None:
        self.address = address
        #: where probe() connects (None: it never probes)
        self.target = target
        #: whether the probe also sends PING on the connection it opened (not over TLS,
        #: where a plain PING is itself a reason to close): a server, proxy or balancer
        #: that accepts and then closes at once refuses as surely as a reset does
        self.ping = ping
        self._probing: asyncio.Future[LockConnectionError | None] | None = None
        self._probed_at = 0.0
        #: the connection error of the latest attempt, while no later one got through
        self.failure: LockConnectionError | None = None
        #: since when (monotonic) Redis has been unreachable
        self.since = 0.0
        self._logged_at: float | None = None
        self._outage_logged = False

    def failed(self, error: LockConnectionError) -> None:
        now = time.monotonic()
        if self.failure is None:
            self.since = now
        self.failure = error
        if self._logged_at is not None and now - self._logged_at < LOG_INTERVAL:
            return
        self._logged_at = now
        self._outage_logged = True
        logger.warning(
            "aiolock cannot reach Redis at %s (for %.1f s so far); waiting tasks keep "
            "retrying until their timeout: %s",
            self.address,
            now - self.since,
            error,
        )

    def reached(self) -> None:
        if self.failure is None:
            return
        self.failure = None
        self._probing = None  # a refusal seen before this answer is out of date
        if self._outage_logged:
            self._outage_logged = False
            logger.warning(
                "aiolock reaches Redis at %s again, after %.1f s",
                self.address,
                time.monotonic() - self.since,
            )

    async def probe(self) -> LockConnectionError | None:
        """The outage, if the server refuses a new connection now; None if it opened one
        (or the probe could not tell within PROBE_LIMIT).

        Asked when a wait ends before any attempt for its lock was answered. One probe runs
        at a time and its answer serves every wait that ends within PROBE_FRESH; a refusal
        is recorded as a failure (logged, and reported by every waiter until an attempt
        gets through).
        """
        if self.failure is not None:
            return self.failure
        if self.target is None:
            return None
        probing = self._probing
        if probing is None or (probing.done() and time.monotonic() - self._probed_at > PROBE_FRESH):
            self._probed_at = time.monotonic()
            probing = self._probing = asyncio.ensure_future(self._connect(self.target))
        # Shielded: a waiter cancelled meanwhile does not cancel the others' probe.
        refused = await asyncio.shield(probing)
        if refused is not None and self.failure is None:
            self.failed(refused)
        return self.failure if refused is not None else None

    async def _connect(self, target: Endpoint) -> LockConnectionError | None:
        writer = None
        closed = False
        try:
            with anyio.move_on_after(PROBE_LIMIT):  # neither opened nor refused: no answer
                if isinstance(target, str):
                    reader, writer = await asyncio.open_unix_connection(target)
                else:
                    reader, writer = await asyncio.open_connection(*target)
                if self.ping:
                    writer.write(b"PING\r\n")  # any reply (+PONG, -NOAUTH...) is a server
                    closed = not await reader.read(1)
        except OSError as exc:
            return LockConnectionError(
                f"a new connection to Redis at {self.address} failed ({exc}), while the "
                "attempts already sent were unanswered"
            )
        finally:
            if writer is not None:
                writer.close()
        if closed:
            return LockConnectionError(
                f"a new connection to Redis at {self.address} was closed without an answer, "
                "while the attempts already sent were unanswered"
            )
        return None

    def unreachable_error(
        self, what: str, timeout: float | None, failure: LockConnectionError
    ) -> LockConnectionError:
        """The error of a wait for *what* that ended while Redis was unreachable."""
        since = ""
        if self.failure is not None:
            since = f" for {time.monotonic() - self.since:.1f} s"
        why = f"Redis at {self.address} could not be reached{since}"
        if POOL_EXHAUSTED in str(failure):
            why = f"the connection pool of the client of {self.address} was exhausted"
        return LockConnectionError(
            f"{what} was not acquired within {timeout} s because {why} (the last attempt "
            f"said: {failure}); this is an outage, not contention"
        )

    def unanswered_error(self, what: str, timeout: float | None) -> LockTimeoutError:
        """The error of a wait for *what* that ran out before Redis answered any attempt.

        The wait ran out, but nobody was seen holding the lock: say so. (Whether the
        server is slow or gone is not known yet; ``command_timeout`` bounds a round trip,
        after which the waiters report the outage.)
        """
        return LockTimeoutError(
            f"{what} was not acquired within {timeout} s, and nobody was seen holding it: "
            f"Redis at {self.address} had not answered the attempt for it yet (a slow, "
            "paused or cut-off server; command_timeout bounds each round trip)"
        )
