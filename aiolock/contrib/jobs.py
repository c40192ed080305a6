"""Singleton jobs: at most one job per resource runs at a time, and the others know who runs.

Framework-neutral; :mod:`aiolock.contrib.arq` and :mod:`aiolock.contrib.taskiq` adapt it
to those queues. A job takes the lock of its resource with one attempt (``timeout=0`` by
default); a job that finds it held is *busy*, and ``on_busy`` says what happens:

* ``"skip"``: the job does not run and returns ``None`` (logged at INFO with the holder);
* ``"raise"``: :class:`JobBusy` is raised, naming the holder;
* ``"defer"``: :class:`JobBusy` is raised with ``defer`` set (seconds), for the queue to
  run the job again later (the arq and taskiq adapters do exactly that);
* a callable ``handler(busy, arguments)``: its result (awaited if it is awaitable) is
  the job's result, or it raises.

While a job holds the lock, a small *holder record* (job id, host, pid, since, fencing
token) is kept next to the lock, at ``<lock key>:job`` in aiolock's own wire format (the
same hash slot; in a format shared with other clients, among aiolock's keys beside the
lock: ``P:<format tag>:{...}:job``, never a key another client's lock could use),
with a TTL of the lease and refreshed with it, deleted before the lock is released.
:func:`holder_info` reads it; :class:`JobBusy` carries it::

    @singleton(locks, "report:{customer_id}", on_busy="skip", job_id="{job_id}")
    async def build_report(customer_id: int, job_id: str) -> str: ...

    async with claim(locks, "report:42", job_id="manual") as me:   # JobBusy if held
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar

from redis.exceptions import RedisError

from aiolock import Lock
from aiolock._decorators import template_fields
from aiolock._errors import LockBackendError, LockTimeoutError, WireFormatError
from aiolock._keys import check_lease, check_timeout
from aiolock._manager import LockManager

__all__ = [
    "BusyHandler",
    "Claim",
    "Holder",
    "JobBusy",
    "claim",
    "holder_info",
    "holder_key",
    "singleton",
]

logger = logging.getLogger("aiolock.jobs")

P = ParamSpec("P")
R = TypeVar("R")

#: What a busy job does, or a handler ``(busy, call arguments) -> result``.
BusyHandler = Callable[["JobBusy", Mapping[str, Any]], Any]
OnBusy = Literal["skip", "defer", "raise"] | BusyHandler
#: The manager, or a function of the call's arguments that finds it (e.g. in arq's ctx).
LocksArg = LockManager | Callable[[Mapping[str, Any]], LockManager]
#: The job id: a template formatted from the call's arguments, or a function of them.
JobIdArg = str | Callable[[Mapping[str, Any]], "str | None"] | None

# Refresh or delete the holder record only if it is still ours: after a lost lease another
# job may have written its own, which must stay.
_IF_OURS = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then return redis.call('del', KEYS[1]) end
return redis.call('pexpire', KEYS[1], ARGV[2])
"""


@dataclass(frozen=True)
class Holder:
    """Who holds a job lock: written by the holder, read by :func:`holder_info`."""

    #: the lock's name, e.g. ``"report:42"``
    name: str
    #: the job's id, when the job said (``job_id=``)
    job_id: str | None
    host: str
    pid: int
    #: when the job took the lock (Unix time, the holder's clock)
    since: float
    #: the fencing token of the hold
    token: int | None = None

    def __str__(self) -> str:
        job = f"job {self.job_id}" if self.job_id else "a job"
        age = max(0.0, time.time() - self.since)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"{job} on {self.host} (pid {self.pid}) since {stamp} ({age:.1f} s ago)"


class JobBusy(LockTimeoutError):
    """The job's lock is held by another job; :attr:`holder` says who, if it is known.

    ``defer`` is set (seconds) when the job should run again later (``on_busy="defer"``).
    """

    def __init__(self, name: str, holder: Holder | None, defer: float | None = None) -> None:
        self.name = name
        self.holder = holder
        self.defer = defer
        who = str(holder) if holder else "another job (it has published no holder record yet)"
        then = f"; run it again in {defer:g} s" if defer is not None else ""
        super().__init__(f"job lock {name!r} is held by {who}{then}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Task queues pickle a job's exception into its result.
        return (type(self), (self.name, self.holder, self.defer))


def holder_key(locks: LockManager, name: str) -> str:
    """The Redis key of the holder record of the lock *name*: ``<lock key>:job`` in
    aiolock's own wire format (see the module docstring)."""
    return _record_key(locks.lock(name))


def _record_key(lock: Lock) -> str:
    # One of aiolock's own keys of the lock (same slot, under the prefix), never derived
    # from the raw lock key: in the token format that is the name itself, and
    # "<name>:holder" would be the lock "<name>:holder" of another client.
    return lock._keys.part("job")


async def holder_info(locks: LockManager, name: str) -> Holder | None:
    """Who holds the job lock *name*, or ``None`` if nobody does or the holder is unknown.

    A record outlives its lock only if the holder died between releasing and deleting
    it; the lock is checked too, so such a record is not reported.
    """
    held, raw = await _read(locks, name)
    if not held or raw is None:
        return None
    return _parse(name, raw)


async def _read(locks: LockManager, name: str) -> tuple[bool, Any]:
    """Whether the lock *name* is held, and its raw holder record (or None)."""
    lock = locks.lock(name)
    try:
        async with locks.redis.pipeline(transaction=False) as pipe:
            pipe.exists(lock.key)
            pipe.get(_record_key(lock))
            held, raw = await pipe.execute()
    except RedisError as exc:
        raise LockBackendError(f"reading the holder of {name!r} failed: {exc}") from exc
    return bool(held), raw


async def _busy_holder(locks: LockManager, name: str) -> Holder | None:
    """The holder a loser reports: a winner publishes its record a round trip after it
    took the lock, so a loser of a simultaneous start waits for it, 0.1 s at most."""
    for _ in range(5):
        held, raw = await _read(locks, name)
        if not held:
            return None
        if raw is not None:
            return _parse(name, raw)
        await asyncio.sleep(0.02)
    return None


def _parse(name: str, raw: Any) -> Holder | None:
    try:
        record = json.loads(raw)
        record.pop("nonce", None)
        return Holder(**record)
    except (ValueError, TypeError):
        logger.warning("the holder record of %r is not one aiolock wrote: %r", name, raw)
        return None


def _token(lock: Lock) -> int | None:
    """The hold's fencing token, or None where the lock's wire format has none."""
    try:
        return lock.fencing_token
    except WireFormatError:
        return None


class Claim:
    """``async with``: hold a job lock and publish a holder record while holding it.

    Entering raises :class:`JobBusy` (with the holder) if the lock stays held for
    ``timeout`` seconds (default: one attempt); it yields this job's own :class:`Holder`.
    The body runs under ``async with lock``, so a lost lease cancels it and raises
    :class:`~aiolock.LockLostError`.
    """

    def __init__(
        self,
        locks: LockManager,
        name: str,
        *,
        job_id: str | None = None,
        timeout: float | None = 0.0,
        lease: float | None = None,
        defer: float | None = None,
    ) -> None:
        self.name = name
        self.job_id = job_id
        self.defer = defer
        self._locks = locks
        self._lock: Lock = locks.lock(name, timeout=timeout, lease=lease)
        # The record lives as long as a hold would without renewal; a renewed hold
        # (no fixed lease) has its record refreshed at the watchdog's pace.
        self._ttl = lease if lease is not None else locks.lease
        self._renewed = lease is None
        self._record: str | None = None
        #: the task refreshing the record; it stops once it is no longer this (see
        #: _withdraw), even if a command of its own swallowed its cancellation
        self._refresher: asyncio.Task[None] | None = None

    @property
    def key(self) -> str:
        return _record_key(self._lock)

    async def __aenter__(self) -> Holder:
        reentry = self._lock._current_hold() is not None  # no I/O
        try:
            await self._lock.__aenter__()
        except LockTimeoutError as exc:
            holder = await _busy_holder(self._locks, self.name)
            raise JobBusy(self.name, holder, self.defer) from exc
        # From here the lock is held and its guard's scope entered: a failure or a
        # cancellation (while the record is written, say) must give both back, as
        # ``async with`` never calls __aexit__ for an __aenter__ that raised. Otherwise
        # the lock stays held and renewed for the task's life, and the scope left open
        # cancels unrelated code of the task once the hold is lost.
        try:
            me = Holder(
                name=self.name,
                job_id=self.job_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                since=time.time(),
                token=_token(self._lock),
            )
            if not reentry:  # an outer claim of this task already published the record
                await self._publish(me)
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return me

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._withdraw()
        finally:
            await self._lock.__aexit__(exc_type, exc, tb)

    async def _publish(self, me: Holder) -> None:
        # The record is an aid for humans and losers: failing to write it must not fail
        # the job, so errors are logged, not raised.
        self._record = json.dumps({**asdict(me), "nonce": uuid.uuid4().hex})
        try:
            await self._locks.redis.set(self.key, self._record, px=max(1, int(self._ttl * 1000)))
        except RedisError as exc:
            logger.warning("could not publish the holder record of %r: %s", self.name, exc)
            self._record = None
            return
        if self._renewed:
            self._refresher = asyncio.create_task(
                self._refresh(), name=f"aiolock-holder-{self.name}"
            )

    async def _refresh(self) -> None:
        assert self._record is not None
        me = asyncio.current_task()
        while self._refresher is me:  # unset by the exit, even if a command swallowed its cancel
            await asyncio.sleep(self._ttl / 3)
            try:
                await self._if_ours(int(self._ttl * 1000))
            except RedisError as exc:  # the next round tries again, within the TTL
                logger.warning("could not refresh the holder record of %r: %s", self.name, exc)

    async def _withdraw(self) -> None:
        refresher, self._refresher = self._refresher, None
        if refresher is not None:
            # Unset above, which ends it after its command, not the cancellation alone: one
            # that arrives as its command's write completes is swallowed on Python 3.11
            # (redis-py sends under asyncio.wait_for, which then returns the command's
            # result), and the refresher went on refreshing every third of the lease while
            # this exit awaited it forever (issue 25). Waited for with asyncio.wait, so
            # that a cancellation of this task itself goes on rather than being taken for
            # the refresher's.
            refresher.cancel()
            await asyncio.wait((refresher,))
            with contextlib.suppress(asyncio.CancelledError):
                refresher.result()
        if self._record is None:
            return
        try:
            await self._if_ours(0)
        except RedisError as exc:  # it expires with the lease, and holder_info skips it
            logger.warning("could not delete the holder record of %r: %s", self.name, exc)
        self._record = None

    async def _if_ours(self, pexpire_ms: int) -> None:
        assert self._record is not None
        await self._locks.redis.eval(_IF_OURS, 1, self.key, self._record, str(pexpire_ms))


def claim(
    locks: LockManager,
    name: str,
    *,
    job_id: str | None = None,
    timeout: float | None = 0.0,
    lease: float | None = None,
    defer: float | None = None,
) -> Claim:
    """Hold the job lock *name* with ``async with``; see :class:`Claim`."""
    return Claim(locks, name, job_id=job_id, timeout=timeout, lease=lease, defer=defer)


def singleton(
    locks: LocksArg,
    name: str,
    *,
    on_busy: OnBusy = "skip",
    job_id: JobIdArg = None,
    timeout: float | None = 0.0,
    lease: float | None = None,
    defer: float = 10.0,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[Any]]]:
    """Run an async job only if no other job holds its resource's lock; see the module doc.

    Args:
        locks: the manager, or a function of the call's arguments (a dict by parameter
            name) that returns it, for managers kept in the job's context.
        name: the lock name, a template formatted from the call's arguments by
            parameter name, e.g. ``"report:{customer_id}"`` or ``"sync:{ctx[tenant]}"``.
        on_busy: ``"skip"``, ``"raise"``, ``"defer"`` or a handler (see the module doc).
        job_id: this job's id for the holder record: a template like *name*, or a
            function of the call's arguments.
        timeout: seconds to wait for the lock before the job counts as busy.
        lease: a fixed lease (not renewed); default: the manager's, renewed.
        defer: seconds after which a deferred job should run again.
    """
    if not (callable(on_busy) or on_busy in ("skip", "defer", "raise")):
        raise ValueError(
            "on_busy must be 'skip', 'defer', 'raise' or a handler(busy, arguments), "
            f"got {on_busy!r}"
        )
    timeout = check_timeout(timeout)
    if lease is not None:
        lease = check_lease(lease)
    defer = check_lease(defer, "defer")
    fields = template_fields(name) + (template_fields(job_id) if isinstance(job_id, str) else [])

    def decorator(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[Any]]:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"singleton() decorates async functions; {function!r} is not one")
        signature = inspect.signature(function)
        missing = [field for field in fields if field not in signature.parameters]
        if missing:
            raise TypeError(
                f"singleton(): the templates refer to {', '.join(map(repr, missing))}, which "
                f"{function.__qualname__}() has no parameter for; its parameters are "
                f"{', '.join(signature.parameters) or 'none'}"
            )

        @functools.wraps(function)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = bound.arguments
            manager = locks if isinstance(locks, LockManager) else locks(arguments)
            if callable(job_id):
                this_id = job_id(arguments)
            else:
                this_id = None if job_id is None else job_id.format_map(arguments)
            held = Claim(
                manager,
                name.format_map(arguments),
                job_id=this_id,
                timeout=timeout,
                lease=lease,
                defer=defer if on_busy == "defer" else None,
            )
            # Entered by hand, so that a JobBusy of the body itself (a nested job) is
            # never mistaken for this job's lock being busy.
            try:
                await held.__aenter__()
            except JobBusy as busy:
                if on_busy == "skip":
                    logger.info("skipped %s: %s", function.__qualname__, busy)
                    return None
                if callable(on_busy):
                    result = on_busy(busy, arguments)
                    return await result if inspect.isawaitable(result) else result
                raise
            try:
                result = await function(*args, **kwargs)
            except BaseException as exc:
                await held.__aexit__(type(exc), exc, exc.__traceback__)
                raise
            await held.__aexit__(None, None, None)
            return result

        return wrapper

    return decorator
