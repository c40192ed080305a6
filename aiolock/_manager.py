"""LockManager: owns the Redis client, the background tasks and the configuration.

A manager is opened with ``async with``; opening starts one task group with the
pub/sub hub (reader and pump), the lease watchdog and the cleanup retrier. Closing
releases what its tasks still hold (best effort, bounded in time), wakes and fails its
waiters, and stops the tasks. Locks are made with :meth:`LockManager.lock`.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
from redis.asyncio import Redis

from ._client import Client
from ._core import LockCore
from ._errors import LockError, ManagerNotOpenError
from ._keys import KeySpace, check_lease, check_name, check_timeout, new_manager_id
from ._lock import Lock
from ._waiters import HubStatistics

__all__ = ["LockManager", "ManagerStatistics"]

logger = logging.getLogger("aiolock")

_MANAGER_OPTIONS = frozenset(
    {"prefix", "lease", "command_timeout", "close_timeout", "fence_ttl", "max_in_flight"}
)


@dataclass(frozen=True)
class ManagerStatistics:
    """A snapshot of a manager's state, for debugging, metrics and tests."""

    #: holds of this manager's tasks (a reentrant hold counts once)
    held: int
    #: the pub/sub hub: queues, waiters, subscriptions, messages, reconnects
    hub: HubStatistics
    #: lease renewal rounds run, and renewal round trips sent
    renewal_rounds: int
    renewal_round_trips: int
    #: undo/release commands waiting to be retried in the background
    pending_cleanups: int


class LockManager:
    """Distributed locks on one Redis, shared by the tasks of this process.

    Args:
        redis: a ``redis.asyncio.Redis`` client (``decode_responses`` either way, RESP2
            or RESP3). The manager does not close a client it was given.
        prefix: the first part of every key and channel, keeping them apart from other
            data and other applications; must not contain ``{`` or ``}``.
        lease: seconds a hold lasts without renewal; holds without an explicit lease are
            renewed every ``lease / 3`` while held.
        command_timeout: seconds any single Redis command may take before it fails with
            :class:`~aiolock.LockConnectionError`; ``None`` leaves it to the client.
        close_timeout: seconds closing the manager may spend releasing held locks.
        fence_ttl: seconds a lock's fencing counter outlives the lock's last use.
        max_in_flight: commands (or pipelines) the manager has in flight at once, hence
            about how many connections it uses besides its one pub/sub connection; more
            concurrent operations are coalesced into pipelines.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str = "aiolock",
        lease: float = 30.0,
        command_timeout: float | None = None,
        close_timeout: float = 5.0,
        fence_ttl: float = 86_400.0,
        max_in_flight: int = 3,
    ) -> None:
        if not isinstance(redis, Redis):
            raise TypeError(
                f"redis must be a redis.asyncio.Redis client, not {type(redis).__name__}; "
                "use LockManager.from_url(url) to create one"
            )
        self._redis = redis
        self._owns_client = False
        self._keyspace = KeySpace(prefix, new_manager_id())
        self.lease = check_lease(lease)
        if command_timeout is not None:
            command_timeout = check_lease(command_timeout, "command_timeout")
        self.close_timeout = check_lease(close_timeout, "close_timeout")
        self.fence_ttl = check_lease(fence_ttl, "fence_ttl")
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            raise TypeError(f"max_in_flight must be an int, not {type(max_in_flight).__name__}")
        if not 1 <= max_in_flight <= 1024:
            raise ValueError(f"max_in_flight must be between 1 and 1024, got {max_in_flight}")
        self._client = Client(redis, command_timeout, max_in_flight)
        self._stop = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        self._owners: weakref.WeakKeyDictionary[asyncio.Task[Any], str] = (
            weakref.WeakKeyDictionary()
        )
        self._serial = 0
        self._state = "new"
        self._core: LockCore | None = None

    @classmethod
    def from_url(cls, url: str, **options: Any) -> LockManager:
        """A manager with its own client made by ``Redis.from_url(url, ...)``.

        The manager's own options (``prefix``, ``lease``, ``command_timeout``,
        ``close_timeout``, ``fence_ttl``, ``max_in_flight``) are taken from *options*;
        the rest go to ``Redis.from_url``. The client is closed when the manager closes.
        """
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        mine = {k: v for k, v in options.items() if k in _MANAGER_OPTIONS}
        theirs = {k: v for k, v in options.items() if k not in _MANAGER_OPTIONS}
        manager = cls(Redis.from_url(url, **theirs), **mine)
        manager._owns_client = True
        return manager

    @property
    def prefix(self) -> str:
        return self._keyspace.prefix

    @property
    def redis(self) -> Redis:
        return self._redis

    @property
    def is_open(self) -> bool:
        return self._state == "open"

    def lock(self, name: str, *, timeout: float | None = None, lease: float | None = None) -> Lock:
        """A handle on the lock *name*; no I/O until it is acquired.

        Args:
            timeout: default wait for :meth:`Lock.acquire` and ``async with``: ``None``
                waits as long as it takes, ``0`` makes one attempt.
            lease: a fixed lease in seconds (not renewed); ``None`` uses the manager's
                lease and renews it in the background while held.
        """
        name = check_name(name)
        timeout = check_timeout(timeout)
        if lease is not None:
            lease = check_lease(lease)
        return Lock(self, self._keyspace.keys(name), timeout=timeout, lease=lease)

    def statistics(self) -> ManagerStatistics:
        core = self._core
        if core is None:
            return ManagerStatistics(0, HubStatistics(0, 0, 0, 0, 0), 0, 0, 0)
        return ManagerStatistics(
            held=len(core.registry),
            hub=core.hub.statistics(),
            renewal_rounds=core.watchdog.rounds,
            renewal_round_trips=core.watchdog.round_trips,
            pending_cleanups=core.cleanup.pending,
        )

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> LockManager:
        if self._state != "new":
            raise ManagerNotOpenError(
                f"this LockManager is {self._state}; a manager can be opened once; "
                "create a new LockManager instead"
            )
        core = self._core = LockCore(self, self._client, self._keyspace)
        # The background tasks run in a task group owned by a supervisor task, not by
        # the task that opens the manager: opening and closing may then happen in
        # different tasks (pytest fixtures, lifespan hooks), and a crash of a background
        # task is logged and fails the manager instead of cancelling an unrelated caller.
        self._stop = asyncio.Event()
        self._supervisor = asyncio.create_task(self._supervise(core), name="aiolock manager")
        self._supervisor.add_done_callback(self._supervisor_done)
        self._state = "open"
        return self

    async def _supervise(self, core: LockCore) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(core.hub.run, name="aiolock pub/sub hub")
            tg.start_soon(core.watchdog.run, name="aiolock lease watchdog")
            tg.start_soon(core.cleanup.run, name="aiolock cleanup")
            await self._stop.wait()
            tg.cancel_scope.cancel()

    def _supervisor_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None or self._state != "open":
            return
        logger.error(
            "aiolock's background tasks failed; the LockManager is unusable",
            exc_info=task.exception(),
        )
        self._state = "failed"
        if self._core is not None:
            self._core.hub.close()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the manager: release held locks (bounded in time), stop background tasks.

        Idempotent. Tasks still inside ``async with`` of this manager's locks get
        :class:`LockLostError`; waiting tasks get :class:`ManagerNotOpenError`.
        """
        supervisor = self._supervisor
        if self._state not in ("open", "failed") or self._core is None or supervisor is None:
            return
        failed = self._state == "failed"
        self._state = "closing"
        core = self._core
        try:
            with anyio.CancelScope(shield=True):
                core.hub.close()  # waiting tasks give up first, so none acquires anew
                with anyio.move_on_after(self.close_timeout):
                    await core.shutdown()
                self._stop.set()
                await asyncio.wait((supervisor,))
                await self._client.aclose()
        finally:
            self._state = "closed"
            if self._owns_client:
                with anyio.CancelScope(shield=True):
                    await self._redis.aclose()
        if failed and not supervisor.cancelled():
            error = supervisor.exception()
            if error is not None:
                raise LockError("aiolock's background tasks had failed") from error

    def __repr__(self) -> str:
        held = len(self._core.registry) if self._core is not None else 0
        return f"<LockManager prefix={self.prefix!r} lease={self.lease} {self._state} held={held}>"

    # -- used by Lock ------------------------------------------------------------------

    def _open_core(self) -> LockCore:
        if self._state == "open" and self._core is not None:
            return self._core
        if self._state == "new":
            raise ManagerNotOpenError(
                "the LockManager is not open: use it as 'async with LockManager(redis) as "
                "locks:' (or 'await manager.__aenter__()') before acquiring locks"
            )
        raise ManagerNotOpenError(
            f"the LockManager is {self._state}: its locks can no longer be used; "
            "open a new LockManager"
        )

    def _owner(self) -> str:
        """The owner field of the current task, assigned on first use."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("aiolock locks must be used from inside an asyncio task")
        owner = self._owners.get(task)
        if owner is None:
            self._serial += 1
            owner = self._owners[task] = self._keyspace.owner(self._serial)
        return owner
