"""LockManager: owns the Redis client, the background tasks and the configuration.

A manager is opened with ``async with``; opening starts one task group with the
pub/sub hub (reader and pump), the lease watchdog and the cleanup retrier. Closing
releases what its tasks still hold (best effort, bounded in time), wakes and fails its
waiters, and stops the tasks. Locks are made with :meth:`LockManager.lock`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from aiolock._engine.contention import (
    DEFAULT_TOP_K,
    NameStatistics,
    check_top_k,
    keep_published,
    summary_key,
)
from aiolock._engine.engine import Engine
from aiolock._engine.hub import WaiterHub
from aiolock._engine.lifecycle import Life, ManagerLifecycle
from aiolock._engine.runtime import Runtime, task_in
from aiolock._engine.waiter import HubStatistics
from aiolock._errors import (
    LockBackendError,
    LockConnectionError,
    LockError,
    LockPermissionError,
)
from aiolock._factories import LockFactories, client_from_sentinel, client_from_url
from aiolock._formats import WireName, check_wire, wire_format
from aiolock._keys import KeySpace, check_lease, check_max_hold, new_manager_id
from aiolock._observe import Observer, ObserverSet
from aiolock._redis.checks import check_pool, client_type_message
from aiolock._redis.client import Client
from aiolock._redis.cluster import (
    ClusterClient,
    check_cluster_support,
    is_cluster,
    refuse_cluster_node,
)
from aiolock._redis.cluster_pubsub import ClusterSubscriptions
from aiolock._redis.identity import Identity, check_app_name
from aiolock._redis.layout import refuse_other_layouts
from aiolock._redis.pubsub import Source, Subscriber
from aiolock._redis.reach import describe
from aiolock._redis.replicas import (
    OnShortfall,
    check_replica_options,
)
from aiolock._redis.sentinel import PrimaryWatch, is_sentinel_primary
from aiolock._redlock.manager import RedlockManager

__all__ = ["LockManager", "ManagerStatistics"]

#: Seconds open()'s check of the server may take when the manager has no command_timeout
#: (redis-py's own connect timeout is unbounded by default: a black-holed address would
#: hang the application's startup).
OPEN_CHECK_TIMEOUT = 10.0


@dataclass(frozen=True)
class ManagerStatistics:
    """A snapshot of a manager's state, for debugging, metrics and tests.

    Attributes:
        held: holds of this manager's tasks (a reentrant hold counts once).
        hub: the pub/sub hub: queues, waiters, subscriptions, messages, reconnects.
        renewal_rounds: lease renewal rounds run by the watchdog.
        renewal_round_trips: renewal round trips sent (many holds per round trip).
        pending_cleanups: undo or release commands waiting to be retried in the background.
        connection_errors: Redis round trips that failed on a connection error (each
            retried on a fresh connection, or ridden out by waiters with backoff).
        released_on_task_exit: holds released because the task that held them ended
            without releasing them.
        held_by_kind: holds now, per kind (``"lock"``, ``"fair lock"``, ``"read lock"``,
            ``"write lock"``, ``"semaphore"``).
        acquired: acquisitions per kind (new holds, not re-entries).
        timeouts: waits that timed out, per kind.
        lost: holds lost, per kind.
        claims: waiters whose place in Redis this manager keeps alive (fair lock,
            read-write writers, semaphore requests; a plain lock's turn: one per name).
        failovers: moves of a Sentinel-managed primary that this manager followed.
        names: contention on the hottest names, hottest first (at most ``top_k``): see
            :class:`~aiolock.NameStatistics`.
    """

    #: holds of this manager's tasks (a reentrant hold counts once)
    held: int
    #: the pub/sub hub: queues, waiters, subscriptions, messages, reconnects
    hub: HubStatistics
    #: lease renewal rounds run, and renewal round trips sent
    renewal_rounds: int
    renewal_round_trips: int
    #: undo/release commands waiting to be retried in the background
    pending_cleanups: int
    #: Redis round trips that failed on a connection error (each retried on a fresh
    #: connection, or ridden out by waiters with backoff until their own timeout)
    connection_errors: int = 0
    #: holds released because the task that held them ended without releasing them
    released_on_task_exit: int = 0
    #: per kind ("lock", "fair lock", "read lock", "write lock", "semaphore"): holds
    #: now, acquisitions (new holds, not re-entries), waits that timed out, holds lost
    held_by_kind: dict[str, int] = field(default_factory=dict)
    acquired: dict[str, int] = field(default_factory=dict)
    timeouts: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)
    #: queued waiters (fair lock) whose place in Redis this manager keeps alive
    claims: int = 0
    #: moves of a Sentinel-managed primary that this manager followed
    failovers: int = 0
    #: contention on the hottest names, hottest first (aiolock._engine.contention)
    names: tuple[NameStatistics, ...] = ()


class LockManager(ManagerLifecycle, LockFactories):
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
        fence_ttl: seconds the last fencing token of a lock is kept in Redis after its
            release, so that tokens keep increasing even if the server's clock is set
            back within that time; ``None`` keeps it forever (tokens that never depend on
            the clock, at the cost of one small key per name ever used); ``0`` keeps
            nothing (tokens then rely on the server's clock alone).
        max_in_flight: commands (or pipelines) the manager has in flight at once, hence
            about how many connections it uses besides its one pub/sub connection; more
            concurrent operations are coalesced into pipelines of at most 16 commands.
            On a Redis Cluster it is shared by the primaries (at least one each).
        observers: :class:`~aiolock.Observer` objects told of every wait, acquisition,
            release, loss and renewal (tracing, metrics); see :meth:`add_observer`.
        wire: the wire format of this manager's locks: ``"aiolock"`` (aiolock's own
            layout, the default) or a format shared with other clients; each factory
            method takes ``wire=`` to choose another one for one lock. See
            ``docs/wire-formats.md``.
        replicas: replicas that must acknowledge each acquisition (``WAIT`` on the same
            connection, in the same round trip); ``None`` or ``0``: no WAIT. Too few
            acknowledgements undo the acquisition and raise
            :class:`~aiolock.ReplicaAckError`. See ``docs/sentinel.md``.
        replica_timeout: seconds WAIT may block an acquisition (shorter than
            ``command_timeout`` and the client's ``socket_timeout``).
        on_replica_shortfall: ``"raise"`` (undo and raise) or ``"warn"`` (keep the
            acquisition and log a warning).
        check_on_open: whether opening the manager checks the server with one round trip
            (``PING``, bounded by ``command_timeout``, or 10 s without one; then ``HELLO``
            to refuse a plain client of a Redis Cluster node), so that a wrong address,
            password, TLS setting or client type fails at startup:
            :class:`~aiolock.LockConnectionError` if Redis cannot be reached,
            :class:`~aiolock.LockPermissionError` if it refuses the credentials,
            :class:`~aiolock.LockBackendError` if its TLS certificate is refused; and
            :class:`~aiolock.IncompatibleLayoutError` beside a manager of another key
            layout on the prefix (``docs/wire-formats.md``). Pass ``False`` for an
            application that may start before Redis does: its waiters then retry until
            their timeout, and the manager logs the outage.
        name: the application's name (``"billing-worker"``), shown by the ``aiolock``
            command next to the host and pid of this manager's holds; 1 to 64 printable
            characters, or ``None``.
        identity: whether the manager keeps its identity record in Redis while open
            (host, pid, process and application name, version, key layout, start time;
            about 200 bytes, refreshed by the lease watchdog, no command per acquire), so
            that the ``aiolock`` command can say who holds a lock (and managers of another
            key layout refuse to open beside it). See ``docs/wire-formats.md``.
        max_hold: the longest any hold of this manager lasts, in seconds (``None``, the
            default: no bound). Renewal goes on until then; at that point the hold ends
            as a loss: its ``async with`` body is cancelled and
            :class:`~aiolock.LockLostError` raised, and the lock is released. Each
            factory method's ``max_hold=`` overrides it for one handle.
        top_k: how many of the hottest names (by total wait time) the manager keeps
            contention statistics for (``statistics().names``, each a
            :class:`~aiolock.NameStatistics`; published beside its identity record for
            ``aiolock top``); 0 keeps none. At most 100.

    A ``Sentinel.master_for()`` client (or :meth:`from_sentinel`) makes the manager
    follow failovers: see ``docs/sentinel.md``.
    """

    _WHAT = "LockManager"
    _HOW_TO_OPEN = (
        "use it as 'async with LockManager(redis) as locks:', or call 'await "
        "manager.open()' (and 'await manager.aclose()' at shutdown)"
    )
    _OPENS_ONCE_HINT = "; create a new LockManager instead"
    _GONE_HINT = ": its locks can no longer be used; open a new LockManager"
    _FAILED_LOG = "aiolock's background tasks failed; the LockManager is unusable"
    _TASK_NAME = "aiolock manager"

    def __init__(
        self,
        redis: Redis | RedisCluster,
        *,
        prefix: str = "aiolock",
        lease: float = 30.0,
        command_timeout: float | None = None,
        close_timeout: float = 5.0,
        fence_ttl: float | None = 60.0,
        max_in_flight: int = 3,
        observers: Iterable[Observer] = (),
        wire: WireName = "aiolock",
        replicas: int | None = None,
        replica_timeout: float = 1.0,
        on_replica_shortfall: OnShortfall = "raise",
        check_on_open: bool = True,
        name: str | None = None,
        identity: bool = True,
        max_hold: float | None = None,
        top_k: int = DEFAULT_TOP_K,
    ) -> None:
        super().__init__()
        if not isinstance(check_on_open, bool):
            raise TypeError(f"check_on_open must be True or False, not {check_on_open!r}")
        self._check_on_open = check_on_open
        if not isinstance(identity, bool):
            raise TypeError(f"identity must be True or False, not {identity!r}")
        self._name = check_app_name(name)
        cluster = is_cluster(redis)
        if cluster:
            check_cluster_support()
        elif not isinstance(redis, Redis):
            raise TypeError(client_type_message(redis))
        else:
            check_pool(redis, max_in_flight)
        self._redis = redis
        self._owns_client = False
        self._keyspace = KeySpace(prefix, new_manager_id())
        self._wire = wire_format(check_wire(wire))
        self.lease = check_lease(lease)
        if command_timeout is not None:
            command_timeout = check_lease(command_timeout, "command_timeout")
        self.close_timeout = check_lease(close_timeout, "close_timeout")
        self.fence_ttl = None if fence_ttl is None else check_fence_ttl(fence_ttl)
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            raise TypeError(f"max_in_flight must be an int, not {type(max_in_flight).__name__}")
        if not 1 <= max_in_flight <= 1024:
            raise ValueError(f"max_in_flight must be between 1 and 1024, got {max_in_flight}")
        policy = check_replica_options(
            replicas, replica_timeout, on_replica_shortfall, command_timeout
        )
        self._client: Client | ClusterClient
        if isinstance(redis, RedisCluster):
            self._client = ClusterClient(redis, command_timeout, max_in_flight)
        else:
            self._client = Client(redis, command_timeout, max_in_flight)
        self._format(None)  # a format refused on a Redis Cluster fails here, at the call
        self._runtime = Runtime(self._client, self._keyspace, self.lease, self.fence_ttl, policy)
        self._runtime.max_hold = self.max_hold = check_max_hold(max_hold)
        self._runtime.top_k = check_top_k(top_k)
        self._identity = (
            Identity(self._client, self._keyspace.identity_key, self._name, self.lease)
            if identity
            else None
        )
        self._owns_sentinels = False
        #: follows failovers of a Sentinel-managed primary (made when the manager opens)
        self._primary_watch: PrimaryWatch | None = None
        self._kinds = {}
        self._plain_locks = {}
        #: the owner id of each task that used a lock, until the task ends (a plain dict
        #: and a done callback: a WeakKeyDictionary lookup made a weak reference per call,
        #: twice per acquire and release)
        self._owners: dict[asyncio.Task[Any], str] = {}
        self._serial = 0
        #: the event loop the manager was opened in, whose tasks use its locks: asking
        #: it for the current task skips asyncio's search for the running loop, which on
        #: Python 3.10 and 3.11 makes a getpid() system call (a third of a microsecond
        #: and more); None until opened
        self._loop: asyncio.AbstractEventLoop | None = None
        self._engine: Engine | None = None
        self._observers = ObserverSet()
        for observer in observers:
            self.add_observer(observer)

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **options: Any) -> LockManager:
        """A manager with its own client made by ``Redis.from_url(url, ...)``.

        The manager's own options (``prefix``, ``lease``, ``command_timeout``,
        ``close_timeout``, ``fence_ttl``, ``max_in_flight``, ``observers``,
        ``check_on_open``, ``name``, ``identity``, the replica options) are taken from
        *options*; the rest go to
        ``Redis.from_url``. The client is closed when the manager closes.
        With ``cluster=True`` the client is a ``RedisCluster.from_url(url, ...)`` for a
        Redis Cluster (*url* names any of its nodes; see ``docs/cluster.md``).
        """
        redis, mine = client_from_url(url, cluster, options)
        manager = cls(redis, **mine)
        manager._owns_client = True
        return manager

    @classmethod
    def from_sentinel(
        cls,
        sentinels: Sequence[tuple[str, int]],
        service_name: str,
        *,
        sentinel_kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> LockManager:
        """A manager on the primary that Redis Sentinel names *service_name*.

        Makes ``Sentinel(sentinels, sentinel_kwargs=..., **rest).master_for(service_name)``,
        where *rest* is *options* minus the manager's own (as for :meth:`from_url`), and
        closes it (and its sentinel connections) when the manager closes. The manager
        follows failovers: see ``docs/sentinel.md``.

        Args:
            sentinels: ``(host, port)`` of each sentinel, e.g. ``[("10.0.0.1", 26379)]``.
            service_name: the name the sentinels monitor the primary under.
            sentinel_kwargs: connection options for the sentinels themselves (e.g. their
                ``password``); by default, the ``socket_*`` options of *options*.
        """
        redis, mine = client_from_sentinel(sentinels, service_name, sentinel_kwargs, options)
        manager = cls(redis, **mine)
        manager._owns_client = manager._owns_sentinels = True
        return manager

    @staticmethod
    def redlock(clients: Sequence[Redis], **options: Any) -> RedlockManager:
        """A manager of Redlocks over independent masters: one client per master.

        *clients* must be an odd number >= 3 of distinct ``redis.asyncio.Redis`` clients;
        *options* are :class:`~aiolock.RedlockManager`'s (``prefix``, ``lease``,
        ``drift_factor``, ``node_timeout``, ``retry_delay``, ``close_timeout``, ``name``,
        ``identity``). See
        ``docs/redlock.md`` for when Redlock is worth it.
        """
        return RedlockManager(clients, **options)

    @property
    def prefix(self) -> str:
        """The first part of every key and channel of this manager."""
        return self._keyspace.prefix

    @property
    def id(self) -> str:
        """This manager's id (32 hex digits): every owner field of its holds starts with
        it, and its identity record is ``<prefix>:mgr:{<id>}``."""
        return self._keyspace.manager_id

    @property
    def name(self) -> str | None:
        """The application name given as ``name=`` (None if none was)."""
        return self._name

    @property
    def redis(self) -> Redis | RedisCluster:
        """The client the manager was given (``Redis``, or ``RedisCluster`` on a cluster)."""
        return self._redis

    @property
    def wire(self) -> str:
        """The manager's wire format (``wire=`` of each factory method overrides it)."""
        return self._wire.name

    def add_observer(self, observer: Observer) -> None:
        """Tell *observer* of every new hold's wait, acquisition and end, and of renewals.

        Takes effect at once, also on an open manager (holds acquired before are not
        reported). Calls ``observer.attached(self)``. Adding an observer twice adds it
        once. See :class:`~aiolock.Observer` and ``docs/observability.md``.
        """
        if observer in self._observers:
            return
        self._observers.add(observer)  # checks the type first
        try:
            observer.attached(self)
        except BaseException:
            self._observers.remove(observer)
            raise

    def remove_observer(self, observer: Observer) -> None:
        """Stop telling *observer* of anything (a no-op if it was not added)."""
        self._observers.remove(observer)

    def statistics(self) -> ManagerStatistics:
        """A snapshot of the manager's state (no I/O); all zeros before it opens."""
        engine = self._engine
        if engine is None:
            return ManagerStatistics(0, HubStatistics(0, 0, 0, 0, 0), 0, 0, 0)
        return ManagerStatistics(
            held=len(engine.registry),
            hub=engine.hub.statistics(),
            renewal_rounds=engine.watchdog.rounds,
            renewal_round_trips=engine.watchdog.round_trips,
            pending_cleanups=engine.cleanup.pending,
            connection_errors=engine.connection_errors + self._client.connection_errors,
            released_on_task_exit=engine.released_on_task_exit,
            held_by_kind=dict(Counter(hold.kind.name for hold in engine.registry)),
            acquired=dict(engine.acquired),
            timeouts=dict(engine.timeouts),
            lost=dict(engine.lost),
            claims=engine.claims,
            failovers=0 if self._primary_watch is None else self._primary_watch.failovers,
            names=engine.contention.snapshot(),
        )

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> LockManager:
        """Open the manager without ``async with`` (a worker's or app's startup hook).

        Pair it with :meth:`aclose` in the shutdown hook. Opening and closing may happen
        in different tasks. Returns the manager. A manager opens once; one whose checks
        at open failed (see ``check_on_open``) is not open and may be opened again.
        """
        return await self.__aenter__()

    async def ping(self) -> float:
        """A health check: seconds one round trip to Redis took, or an error saying what is wrong.

        Raises :class:`ManagerNotOpenError` if the manager is not open (or its background
        tasks failed), :class:`LockPermissionError` if Redis refuses this client's
        credentials or a command aiolock needs (subscribing included), and
        :class:`LockConnectionError` if Redis cannot be reached.
        """
        engine = self._open_engine()
        if engine.hub.failure is not None:
            raise LockPermissionError(engine.hub.failure)
        started = time.monotonic()
        await engine.client.call("PING")
        return time.monotonic() - started

    async def _before_open(self) -> None:
        if self._check_on_open:
            await self._check_server()
            if self._identity is not None:  # Redis answers: the record exists from now on
                await self._identity.publish()
            limit = self._client.command_timeout or OPEN_CHECK_TIMEOUT
            own = [] if self._identity is None else [self._identity]
            await refuse_other_layouts([self._client], self.prefix, self.id, own, self._WHAT, limit)

    async def _check_server(self) -> None:
        """One PING before anything starts: a wrong address, password or certificate fails
        here; then a plain client of a Cluster node is refused."""
        limit = self._client.command_timeout or OPEN_CHECK_TIMEOUT
        where = f"Redis at {describe(self._redis)}"
        skip = (
            " (an application that starts before Redis can pass check_on_open=False to "
            "open without this check)"
        )
        try:
            with anyio.fail_after(limit):
                await self._client.call("PING")
        except TimeoutError as exc:
            raise LockConnectionError(
                f"the LockManager could not open: {where} did not answer PING within "
                f"{limit} s; check the address and that the server is up{skip}"
            ) from exc
        except LockConnectionError as exc:
            raise LockConnectionError(
                f"the LockManager could not open: {where} could not be reached: {exc}; "
                f"check the address (host, port, TLS) and that the server is up{skip}"
            ) from exc
        except LockBackendError as exc:  # credentials, TLS certificate: no retry mends them
            raise type(exc)(f"the LockManager could not open: {exc}") from exc
        if not isinstance(self._client, ClusterClient):
            # A plain client of a Cluster node would lose every hold at its first
            # renewal (CROSSSLOT): refused here, where the server answers anyway.
            await refuse_cluster_node(self._client)

    def _opening(self) -> None:
        # The hub's subscriptions: sharded ones on the primary of each channel's slot on a
        # Redis Cluster, one connection on a single server.
        source: Source
        if isinstance(self._client, ClusterClient):
            source = ClusterSubscriptions(self._client)
        else:
            source = Subscriber(self._client.redis)
        self._loop = asyncio.get_running_loop()
        hub = WaiterHub(source, self._keyspace.manager_id)
        hub.loop = self._loop  # (its waiters' tasks are found in it: see _loop)
        self._engine = Engine(self._runtime, hub, self._observers)

    def _start_tasks(self, tg: TaskGroup) -> None:
        core = self._engine
        assert core is not None  # made by _opening()
        tg.start_soon(core.hub.run, name="aiolock pub/sub hub")
        tg.start_soon(core.watchdog.run, name="aiolock lease watchdog")
        if self._identity is not None:
            tg.start_soon(self._identity.keep, core.watchdog.period, name="aiolock identity")
            if self._runtime.top_k:
                top, call, reach = summary_key(self._identity.key), self._client.call, core.reach
                tg.start_soon(  # (reach.failure: the last round trip's, until one succeeds)
                    keep_published, core.contention, call, top, self.lease,
                    lambda: reach.failure is None,
                )  # fmt: skip
        tg.start_soon(core.cleanup.run, name="aiolock cleanup")
        tg.start_soon(core.keep_claims, name="aiolock waiter registrations")
        tg.start_soon(core.keep_listeners, name="aiolock listener registrations")
        if isinstance(self._redis, Redis) and is_sentinel_primary(self._redis):
            watch = PrimaryWatch(
                self._redis, core.watchdog.renew_all, owns_sentinels=self._owns_sentinels
            )
            self._primary_watch = watch
            tg.start_soon(watch.run, name="aiolock sentinel watch")

    def _failed(self) -> None:
        if self._engine is not None:
            self._engine.hub.close()

    def stop_acquiring(self) -> None:
        """Begin a graceful stop: no task of this manager gets a lock any more.

        Waiting tasks, and every new acquisition, fail at once with
        :class:`ManagerNotOpenError` (a 503 in the web helpers); tasks that hold locks keep
        them until they release them or :meth:`aclose` runs, so their work can finish.
        Call it when the service stops taking requests, before the server cancels the
        handlers: aiohttp's ``on_shutdown`` (:func:`aiolock.contrib.aiohttp.lock_manager_ctx`
        does it). Idempotent; a no-op unless the manager is open.
        """
        if self._state is Life.OPEN and self._engine is not None:
            self._engine.hub.close()

    @property
    def is_acquiring(self) -> bool:
        """Whether the manager hands out locks: open, and not stopped by
        :meth:`stop_acquiring` (or the server's shutdown signal, with FastAPI's
        ``lock_lifespan``). A readiness check may answer from it."""
        return self._state is Life.OPEN and self._engine is not None and not self._engine.hub.closed

    async def aclose(self) -> None:
        """Close the manager: release held locks (bounded in time), stop background tasks.

        Idempotent. Tasks still inside ``async with`` of this manager's locks get
        :class:`LockLostError`; waiting tasks get :class:`ManagerNotOpenError`.
        """
        error = await self._close()
        if error is not None:
            raise LockError("aiolock's background tasks had failed") from error

    async def _drain(self) -> None:
        core = self._engine
        assert core is not None  # made when opening
        core.hub.close()  # waiting tasks give up first, so none acquires anew
        with anyio.move_on_after(self.close_timeout):
            await core.shutdown()

    async def _after_stop(self) -> None:
        if self._identity is not None:  # after the watchdog, which writes it
            with anyio.move_on_after(self.close_timeout):
                await self._identity.delete()
        await self._client.aclose()

    async def _after_close(self) -> None:
        if self._owns_client:
            with anyio.CancelScope(shield=True):
                await self._redis.aclose()

    def __repr__(self) -> str:
        held = len(self._engine.registry) if self._engine is not None else 0
        return f"<LockManager prefix={self.prefix!r} lease={self.lease} {self._state} held={held}>"

    # -- used by the handles -----------------------------------------------------------

    def _open_engine(self) -> Engine:
        if self._state is not Life.OPEN:  # (checked here first: every operation passes here)
            self._check_open()
        assert self._engine is not None  # made when opening
        return self._engine

    def _owner(self) -> str:
        """The owner field of the current task, assigned on first use."""
        loop = self._loop  # (see _loop)
        task = asyncio.current_task() if loop is None else task_in(loop)
        owner = self._owners.get(task)  # type: ignore[arg-type]
        if owner is None:
            if task is None:
                raise RuntimeError("aiolock locks must be used from inside an asyncio task")
            self._serial += 1
            owner = self._owners[task] = self._keyspace.owner(self._serial)
            task.add_done_callback(self._forget_owner)
        return owner

    def _forget_owner(self, task: asyncio.Task[Any]) -> None:
        self._owners.pop(task, None)


def check_fence_ttl(value: object) -> float:
    """``fence_ttl``: 0 (keep no fence state) or a lease-like number of seconds."""
    if not isinstance(value, bool) and isinstance(value, (int, float)) and value == 0:
        return 0.0
    return check_lease(value, "fence_ttl")
