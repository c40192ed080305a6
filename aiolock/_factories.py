"""How a LockManager's parts are made: its handle factories (a mixin), and the client of
its ``from_url()`` and ``from_sentinel()``.

:class:`LockFactories` makes the handles (``lock()``, ``fair_lock()``, ``rw_lock()``,
``semaphore()``, ``multi_lock()``, ``leader()``) and the decorators (``locked()``,
``limited()``) from the manager's key space, wire format, kinds and replica policy. It
holds no state of its own: :class:`~aiolock.LockManager` sets what it uses, listed at the
top of the class. A mixin, not a composed object, because each factory method is part of
the manager's public API (and documented there) and hands the manager itself to the
handles it makes.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from aiolock._decorators import LOCK_MAKERS, LockKindName, OnBusy, decorate
from aiolock._engine.handle import _DEFAULT
from aiolock._engine.lockhandle import Lock
from aiolock._engine.runtime import Runtime
from aiolock._errors import WireFormatError
from aiolock._formats import WireFormat, WireName, check_wire, wire_format
from aiolock._keys import (
    KeySpace,
    LockKeys,
    check_lease,
    check_max_hold,
    check_name,
    check_timeout,
)
from aiolock._kinds.fair.handle import FairLock
from aiolock._kinds.multi.handle import MultiLock, check_names
from aiolock._kinds.rw.handle import ReadWriteLock
from aiolock._kinds.semaphore.handle import Semaphore
from aiolock._kinds.semaphore.kind import check_limit
from aiolock._leader import LeaderElection
from aiolock._redis.client import Client
from aiolock._redis.cluster import check_cluster_support
from aiolock._redis.replicas import HandlePolicy, check_handle_replicas
from aiolock._redis.sentinel import check_sentinels, sentinel_client

if TYPE_CHECKING:
    from aiolock._engine.engine import Engine
    from aiolock._engine.kind import LockKind
    from aiolock._engine.lifecycle import Life
    from aiolock._redis.cluster import ClusterClient

__all__ = ["MANAGER_OPTIONS", "LockFactories", "client_from_sentinel", "client_from_url"]

_K = TypeVar("_K")
P = ParamSpec("P")
R = TypeVar("R")


class LockFactories:
    """The factory methods of :class:`~aiolock.LockManager` (see its docs)."""

    # What the factories use of the manager (set by LockManager.__init__).
    _keyspace: KeySpace
    _wire: WireFormat
    _client: Client | ClusterClient
    _runtime: Runtime
    #: the manager's instance of each lock kind, by factory (see _kind)
    _kinds: dict[object, object]
    #: lock(name) of the manager's wire format: the checked name's kind and keys, so a
    #: handle made per call (``lock(name)`` in a request handler) checks and builds them
    #: once per name (see _plain_lock)
    _plain_locks: dict[str, tuple[LockKind, LockKeys]]

    if TYPE_CHECKING:  # the manager's, handed to the handles (see _guard.ManagerLike)
        _engine: Engine | None
        _state: Life

        @property
        def is_open(self) -> bool: ...

        @property
        def wire(self) -> str: ...

        def _open_engine(self) -> Engine: ...

        def _owner(self) -> str: ...

    def lock(
        self,
        name: str,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        wire: WireName | None = None,
        replicas: int | None = None,
        replica_timeout: float | None = None,
        max_hold: float | None = _DEFAULT,
    ) -> Lock:
        """A handle on the lock *name*; no I/O until it is acquired.

        Args:
            timeout: default wait for :meth:`Lock.acquire` and ``async with``: ``None``
                waits as long as it takes, ``0`` makes one attempt.
            lease: a fixed lease in seconds (not renewed); ``None`` uses the manager's
                lease and renews it in the background while held.
            wire: this lock's wire format, instead of the manager's.
            replicas: replicas that must acknowledge this lock's acquisitions, instead of
                the manager's ``replicas=`` (``0``: none); see ``docs/sentinel.md``.
            replica_timeout: how long WAIT may block them, instead of the manager's.
            max_hold: the longest a hold of this handle lasts, in seconds (renewal stops
                there: the body is cancelled, :class:`LockLostError` raised and the lock
                released), instead of the manager's ``max_hold``; ``None``: no bound.
        """
        made = self._plain_locks.get(name) if wire is None and type(name) is str else None
        if made is None:
            made = self._plain_lock(name, wire)
        if timeout is not None:
            timeout = check_timeout(timeout)
        if lease is not None:
            lease = check_lease(lease)
        handle = Lock(self, made[0], made[1], timeout, lease)  # (no keywords: no dict made)
        if replicas is not None or replica_timeout is not None:  # else it inherits
            handle._replicas = self._handle_replicas(replicas, replica_timeout)
        if max_hold is not _DEFAULT:  # else it inherits
            handle._max_hold = check_max_hold(max_hold)
        return handle

    def multi_lock(
        self,
        names: Iterable[str],
        *,
        timeout: float | None = None,
        lease: float | None = None,
        wire: WireName | None = None,
        replicas: int | None = None,
        replica_timeout: float | None = None,
        max_hold: float | None = _DEFAULT,
    ) -> MultiLock:
        """A handle on several locks taken as one: all of *names* or none; no I/O yet.

        The names are acquired in one global order (so multi-locks never deadlock each
        other), each with its own script call (so they may live in different Redis
        Cluster slots), within one shared *timeout*; a failed or cancelled acquire
        releases what it took. Each name is an ordinary lock: ``lock(name)`` elsewhere
        excludes and is excluded by it.

        Args:
            timeout: the wait for all of them together (``None``: as long as it takes).
            lease: a fixed lease for each hold; ``None`` renews them in the background.
            wire: the wire format of the names' locks, instead of the manager's.
            replicas: as for :meth:`lock`, for each name.
            replica_timeout: as for :meth:`lock`, for each name.
            max_hold: as for :meth:`lock`, for each name.
        """
        checked = check_names(names)
        timeout = check_timeout(timeout)
        if lease is not None:
            lease = check_lease(lease)
        fmt = self._format(wire)
        pairs = [fmt.lock(self._kind, self._keyspace, name) for name in checked]
        kind = pairs[0][0]
        multi = MultiLock(self, kind, [keys for _, keys in pairs], timeout=timeout, lease=lease)
        multi._replicas = self._handle_replicas(replicas, replica_timeout)
        if max_hold is not _DEFAULT:
            multi._max_hold = check_max_hold(max_hold)
        return multi

    def semaphore(
        self,
        name: str,
        limit: int,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        wire: WireName | None = None,
        replicas: int | None = None,
        replica_timeout: float | None = None,
        max_hold: float | None = _DEFAULT,
    ) -> Semaphore:
        """A handle on the semaphore *name*, which grants at most *limit* permits at once.

        The limit is stored in Redis by the first acquire; a handle made with another
        limit gets :class:`LockError` at its next acquire (see :meth:`Semaphore.set_limit`).
        *timeout* and *lease* are the defaults of :meth:`Semaphore.acquire`, as for
        :meth:`lock`; *wire* its wire format, instead of the manager's; *replicas*,
        *replica_timeout* and *max_hold* as for :meth:`lock`. See ``docs/semaphore.md``.
        """
        name = check_name(name)
        limit = check_limit(limit)
        timeout = check_timeout(timeout)
        if lease is not None:
            lease = check_lease(lease)
        kind, keys = self._format(wire).semaphore(self._kind, self._keyspace, name, limit)
        semaphore = Semaphore(self, kind, keys, timeout=timeout, lease=lease)
        semaphore._replicas = self._handle_replicas(replicas, replica_timeout)
        if max_hold is not _DEFAULT:
            semaphore._max_hold = check_max_hold(max_hold)
        return semaphore

    def rw_lock(
        self,
        name: str,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        wire: WireName | None = None,
        replicas: int | None = None,
        replica_timeout: float | None = None,
        max_hold: float | None = _DEFAULT,
    ) -> ReadWriteLock:
        """A handle on the read-write lock *name* (many readers or one writer); no I/O yet.

        ``rw.read()`` and ``rw.write()`` give the two sides, each with the Lock API.
        A read-write lock is a different object from the plain lock of the same name.

        Args:
            timeout: default wait of both sides (``None``: as long as it takes).
            lease: a fixed lease in seconds for both sides; ``None`` renews holds.
            wire: its wire format, instead of the manager's.
            replicas: as for :meth:`lock`, for both sides.
            replica_timeout: as for :meth:`lock`, for both sides.
            max_hold: as for :meth:`lock`, for both sides.
        """
        name = check_name(name)
        timeout = check_timeout(timeout)
        if lease is not None:
            lease = check_lease(lease)
        read, write, keys = self._format(wire).rw_lock(self._kind, self._keyspace, name)
        rw = ReadWriteLock(self, read, write, keys, timeout=timeout, lease=lease)
        rw._set_replicas(self._handle_replicas(replicas, replica_timeout))
        if max_hold is not _DEFAULT:
            rw._set_max_hold(check_max_hold(max_hold))
        return rw

    def fair_lock(
        self,
        name: str,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        wire: WireName | None = None,
        replicas: int | None = None,
        replica_timeout: float | None = None,
        max_hold: float | None = _DEFAULT,
    ) -> FairLock:
        """A handle on the fair lock *name*: granted in the order acquires reached Redis.

        The API is :class:`Lock`'s, with the same *timeout* and *lease* defaults. A fair
        lock is a different object from ``lock(name)`` (its keys have their own tag). See
        :class:`FairLock` and ``docs/fair-lock.md``. *wire* chooses its wire format,
        instead of the manager's; *replicas*, *replica_timeout* and *max_hold* are as for
        :meth:`lock`.
        """
        name = check_name(name)
        timeout = check_timeout(timeout)
        if lease is not None:
            lease = check_lease(lease)
        kind, keys = self._format(wire).fair_lock(self._kind, self._keyspace, name)
        fair = FairLock(self, kind, keys, timeout=timeout, lease=lease)
        fair._replicas = self._handle_replicas(replicas, replica_timeout)
        if max_hold is not _DEFAULT:
            fair._max_hold = check_max_hold(max_hold)
        return fair

    def leader(self, name: str) -> LeaderElection:
        """An election for *name*: at most one process at a time leads it; no I/O.

        Leading is holding the lock *name* (the manager's wire format) with the manager's
        lease, renewed while the process lives; a crashed leader's term ends within one
        lease. See :class:`LeaderElection` and ``docs/leader-election.md``.
        """
        # A leader leads for as long as its process lives: the manager's max_hold, a bound
        # for bodies that hang, is not one for a term.
        lock = self.lock(name, max_hold=None)
        if lock._kind.fencing_unavailable:
            raise WireFormatError(
                f"leader election needs fencing tokens, which the {self.wire!r} wire format "
                f"does not have ({lock._kind.fencing_unavailable}); use the default wire format"
            )
        return LeaderElection(self, lock)

    def locked(
        self,
        name: str | Sequence[str],
        *,
        timeout: float | None = None,
        lease: float | None = None,
        on_busy: OnBusy = "wait",
        kind: LockKindName = "lock",
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]:
        """Decorate an async function to run under the lock *name*, formatted per call.

        *name* is a template filled from the call's arguments by parameter name
        (``"order:{order_id}"``, ``"{self.tenant}:report"``); every field must name a
        parameter, checked when decorating. A list of templates takes a multi-lock.
        *kind* picks ``"lock"``, ``"fair"`` (a fair lock), ``"read"`` or ``"write"`` (a
        side of a read-write lock). *on_busy*: ``"wait"`` up to *timeout* (``None``: as
        long as it takes) then raise :class:`LockTimeoutError`; ``"skip"``: return
        ``None`` without running; ``"raise"``: raise :class:`LockTimeoutError` (these two
        try once unless a *timeout* is given). A lost lock cancels the call and raises
        :class:`LockLostError`. Works for methods. The manager must be open at call time.
        """
        if kind not in LOCK_MAKERS:
            raise ValueError(
                f"kind must be one of {', '.join(map(repr, LOCK_MAKERS))}, got {kind!r}; "
                "for a semaphore use limited()"
            )
        if not isinstance(name, str) and kind != "lock":
            raise TypeError(f"a list of names makes a multi-lock, which kind={kind!r} is not")
        return decorate(
            self, name, LOCK_MAKERS[kind], timeout=timeout, lease=lease, on_busy=on_busy,
            what="locked()",
        )  # fmt: skip

    def limited(
        self,
        name: str,
        limit: int,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        on_busy: OnBusy = "wait",
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]:
        """Decorate an async function to run holding one permit of the semaphore *name*.

        Like :meth:`locked` (a name template, *timeout*, *lease*, *on_busy*), for a
        semaphore of *limit* permits: at most *limit* calls run at once across clients.
        """
        limit = check_limit(limit)
        if not isinstance(name, str):
            raise TypeError(f"limited() takes one name template (str), not {name!r}")

        def make(manager: Any, names: Any, timeout: float | None, lease: float | None) -> Any:
            return manager.semaphore(names, limit, timeout=timeout, lease=lease)

        return decorate(
            self, name, make, timeout=timeout, lease=lease, on_busy=on_busy, what="limited()"
        )

    # -- used by the factories ---------------------------------------------------------

    def _plain_lock(self, name: object, wire: WireName | None) -> tuple[LockKind, LockKeys]:
        """The kind and keys of ``lock(name, wire=wire)``, the name checked; those of the
        manager's own wire format are kept for the next handle of the name."""
        name = check_name(name)
        made = self._format(wire).lock(self._kind, self._keyspace, name)
        if wire is None:
            if len(self._plain_locks) >= KeySpace.KNOWN_MAX:
                self._plain_locks.clear()  # as KeySpace does: a miss only costs a rebuild
            self._plain_locks[name] = made
        return made

    def _kind(self, factory: Callable[[Runtime], _K]) -> _K:
        """The manager's instance of a lock kind (one per kind, made on first use)."""
        kind = self._kinds.get(factory)
        if kind is None:
            kind = self._kinds[factory] = factory(self._runtime)
        return kind  # type: ignore[return-value]

    def _handle_replicas(self, replicas: object, replica_timeout: object) -> HandlePolicy:
        """A factory's replicas= and replica_timeout=, checked at the call."""
        return check_handle_replicas(
            replicas, replica_timeout, self._runtime.replicas, self._client.command_timeout
        )

    def _format(self, wire: str | None) -> WireFormat:
        """The manager's wire format, or the one a factory call asked for."""
        fmt = self._wire if wire is None else wire_format(check_wire(wire))
        if fmt.cluster_unsupported and self._client.cluster:
            raise WireFormatError(
                f"the {fmt.name!r} wire format is not supported on a Redis Cluster: "
                f"{fmt.cluster_unsupported}. Use it with a single server or Sentinel"
            )
        return fmt


# -- the clients of LockManager.from_url() and from_sentinel() -------------------------

#: The options of LockManager.from_url() and from_sentinel() that are the manager's own
#: (the rest go to redis-py).
MANAGER_OPTIONS = frozenset(
    {
        "prefix",
        "lease",
        "command_timeout",
        "close_timeout",
        "fence_ttl",
        "max_in_flight",
        "observers",
        "wire",
        "replicas",
        "replica_timeout",
        "on_replica_shortfall",
        "check_on_open",
        "name",
        "identity",
        "max_hold",
        "top_k",
    }
)


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """*options* as (the manager's own, redis-py's)."""
    mine = {k: v for k, v in options.items() if k in MANAGER_OPTIONS}
    theirs = {k: v for k, v in options.items() if k not in MANAGER_OPTIONS}
    return mine, theirs


def client_from_url(
    url: object, cluster: object, options: dict[str, Any]
) -> tuple[Redis | RedisCluster, dict[str, Any]]:
    """The client of ``LockManager.from_url(url, cluster=..., **options)``, and the
    manager's own options; an option that neither takes fails here, at the call."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, not {type(url).__name__}")
    if not isinstance(cluster, bool):
        raise TypeError(f"cluster must be True or False, not {cluster!r}")
    mine, theirs = _split(options)
    if cluster:
        check_cluster_support()
        try:
            # Connects nowhere yet; an unknown option fails here, at the call.
            return RedisCluster.from_url(url, **theirs), mine
        except TypeError as exc:
            raise TypeError(
                f"LockManager.from_url(cluster=True) got an option that "
                f"redis.asyncio.cluster.RedisCluster.from_url() does not take ({exc}); the "
                f"manager's options are {', '.join(sorted(MANAGER_OPTIONS))}"
            ) from None
    redis = Redis.from_url(url, **theirs)
    try:
        # Builds a connection object without connecting: an unknown option fails
        # here, at the call, instead of at the first acquire.
        redis.connection_pool.make_connection()  # type: ignore[no-untyped-call]
    except TypeError as exc:
        unknown = ", ".join(sorted(set(theirs) - _known_options(redis)))
        raise TypeError(
            f"LockManager.from_url() got an unknown option: {unknown or exc}; the "
            f"manager's options are {', '.join(sorted(MANAGER_OPTIONS))}, the rest "
            "go to redis.asyncio.Redis.from_url()"
        ) from None
    return redis, mine


def client_from_sentinel(
    sentinels: Sequence[tuple[str, int]],
    service_name: str,
    sentinel_kwargs: Mapping[str, Any] | None,
    options: dict[str, Any],
) -> tuple[Redis, dict[str, Any]]:
    """The client of ``LockManager.from_sentinel(...)``, and the manager's own options."""
    addresses = check_sentinels(sentinels, service_name)
    mine, theirs = _split(options)
    return sentinel_client(addresses, service_name, sentinel_kwargs, theirs), mine


def _known_options(redis: Redis) -> set[str]:
    """Keyword options that Redis.from_url() passes on to redis-py without complaint."""
    known: set[str] = set()
    for target in (Redis.__init__, type(redis.connection_pool).__init__):
        known.update(inspect.signature(target).parameters)
    connection_class = redis.connection_pool.connection_class
    for cls in connection_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is not None:
            known.update(inspect.signature(init).parameters)
    return known
