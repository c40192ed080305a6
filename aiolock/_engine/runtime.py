"""What the engine and the lock kinds receive from the manager, instead of the manager.

One :class:`Runtime` per open manager: the client, the naming of keys and ids, and the
options that shape the wire traffic. It holds no reference back to the manager, so
neither the engine nor a kind can reach into the manager's lifecycle. The client is
described by :class:`RuntimeClient`, which the manager's ``Client`` and ``ClusterClient``
both satisfy: the engine never imports the cluster topology.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Callable
from typing import Any, Protocol

from aiolock._engine.contention import DEFAULT_TOP_K
from aiolock._engine.kind import ScriptRunner
from aiolock._keys import KeySpace, ms
from aiolock._redis.replicas import ReplicaPolicy

__all__ = ["TOMBSTONE_TTL", "Runtime", "RuntimeClient", "task_in"]

#: ``task_in(loop)``: the task *loop* runs now (None outside a task), the answer of
#: ``asyncio.current_task(loop)``; *loop* must not be None (``current_task()`` searches
#: for the running loop, this would answer None). Before Python 3.12, ``current_task`` is
#: a Python function that returns ``_current_tasks.get(loop)`` (the dict asyncio's tasks
#: update as they run): that lookup, called directly, costs about 1,000 instructions
#: fewer, three times per uncontended cycle (the owner asked for twice, the fast path's
#: entry once). From 3.12 ``current_task`` is the C function, used as it is.
task_in: Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None]
if sys.version_info >= (3, 12):
    task_in = asyncio.current_task
else:
    task_in = getattr(asyncio.tasks, "_current_tasks").get  # noqa: B009 (not in typeshed)

#: Seconds a final release is remembered in Redis, so that a resend within that time
#: (a retry after a dropped connection, a shielded finish, the background retrier, or
#: the owner calling release() again) is recognised as done, however busy the lock was.
TOMBSTONE_TTL = 10.0


class RuntimeClient(ScriptRunner, Protocol):
    """What the engine and the kinds use of the manager's client (one server or a cluster)."""

    @property
    def cluster(self) -> bool:
        """Whether a script may only touch keys of one slot (renewals are grouped by slot)."""
        ...

    @property
    def redis(self) -> Any:
        """The redis-py client underneath (named in errors: see ``_reach.describe``)."""
        ...


class Runtime:
    __slots__ = (
        "client",
        "fence_ms",
        "ids",
        "keyspace",
        "lease",
        "manager_id",
        "max_hold",
        "replicas",
        "tombstone_ms",
        "top_k",
    )

    def __init__(
        self,
        client: RuntimeClient,
        keyspace: KeySpace,
        lease: float,
        fence_ttl: float | None,
        replicas: ReplicaPolicy | None = None,
    ) -> None:
        self.client = client
        self.keyspace = keyspace
        self.manager_id = keyspace.manager_id
        #: the manager's lease: auto-renewed holds get it
        self.lease = lease
        #: fence state lifetime as the scripts take it: '0' none, '-1' forever, else ms
        if fence_ttl is None:
            self.fence_ms = "-1"
        else:
            self.fence_ms = "0" if fence_ttl == 0 else str(ms(fence_ttl))
        self.tombstone_ms = ms(TOMBSTONE_TTL)
        #: numbers for attempts and releases, unique within the manager
        self.ids = itertools.count(1)
        #: replicas that must acknowledge each acquisition (WAIT), or None
        self.replicas = replicas
        #: the longest a hold lasts unless its handle says otherwise (None: no bound)
        self.max_hold: float | None = None
        #: how many names the per-name contention statistics track (0: none)
        self.top_k = DEFAULT_TOP_K

    def next_id(self) -> int:
        return next(self.ids)
