"""Whether the manager can reach Redis, as its latest round trips found, and the log of it.

Only the head of a lock's local queue talks to Redis (see :mod:`aiolock._engine.engine`), so
the other waiters never see a connection failure themselves. The engine records each
attempt's outcome here; a waiter whose wait ends while the last attempt failed on a
connection error then reports the outage (:class:`~aiolock.LockConnectionError`), not
contention. The transitions are logged (rate-limited), so an outage is never silent,
even for waiters that wait without a timeout.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiolock._errors import LockConnectionError, LockTimeoutError
from aiolock._redis.client import POOL_EXHAUSTED

__all__ = ["LOG_INTERVAL", "Reachability", "describe"]

logger = logging.getLogger("aiolock")

#: At most one "cannot reach" warning per this many seconds (a flapping link or a long
#: outage would otherwise log on every retry of every waiter).
LOG_INTERVAL = 30.0


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


class Reachability:
    """The outcome of the manager's latest round trip to Redis: reached, or why not."""

    def __init__(self, address: str) -> None:
        self.address = address
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
        if self._outage_logged:
            self._outage_logged = False
            logger.warning(
                "aiolock reaches Redis at %s again, after %.1f s",
                self.address,
                time.monotonic() - self.since,
            )

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
