"""Replica acknowledgement: ``WAIT`` after every acquisition (``replicas=`` on the manager).

Redis replicates asynchronously: a primary that fails right after granting a lock may
not have passed the grant on, and the replica promoted in its place does not know the
lock is held. ``WAIT numreplicas timeout`` blocks until that many replicas have
acknowledged every write this *connection* made before it, or the timeout passes, and
answers how many did. It must therefore run on the connection that ran the acquire
script: :class:`Client` sends the two in one round trip on one connection (a WAIT on
any other connection measures that connection's writes, i.e. none).

What a sufficient answer does and does not mean: the grant reached that many replicas'
memory. It does not make the write durable or the system strongly consistent: a replica
that acknowledged may still not be the one promoted, Sentinel may promote a replica
that lags, and a partitioned primary may keep accepting writes until
``min-replicas-to-write`` stops it. Only acquisitions are followed by WAIT (releases
and renewals are not: losing them errs on the safe side, the lock expires or is
re-checked).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal, TypeVar

from redis import exceptions as rex

from aiolock._errors import ReplicaAckError
from aiolock._keys import check_lease

__all__ = [
    "ACKNOWLEDGE",
    "INHERIT",
    "Acknowledgement",
    "HandlePolicy",
    "OnShortfall",
    "ReplicaPolicy",
    "acknowledged",
    "check_handle_replicas",
    "check_replica_options",
    "effective_policy",
    "handle_policy",
    "under_policy",
]

logger = logging.getLogger("aiolock")

T = TypeVar("T")

OnShortfall = Literal["raise", "warn"]
_SHORTFALL_CHOICES = ("raise", "warn")


@dataclass(frozen=True)
class ReplicaPolicy:
    """How many replicas must acknowledge an acquisition, within how long."""

    replicas: int
    timeout: float
    on_shortfall: OnShortfall

    @property
    def wait_command(self) -> tuple[str, int, int]:
        # WAIT's timeout is in ms and 0 means "block forever": never send 0.
        return ("WAIT", self.replicas, max(1, round(self.timeout * 1000)))


def check_replica_options(
    replicas: object,
    replica_timeout: object,
    on_replica_shortfall: object,
    command_timeout: float | None,
) -> ReplicaPolicy | None:
    """Validate the manager's ``replicas=`` options; ``None`` when WAIT is off.

    Every option is checked, also when WAIT is off, so that a typo fails at the call.
    """
    if replicas is not None:
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise TypeError(f"replicas must be an int (or None), not {type(replicas).__name__}")
        if not 0 <= replicas <= 100:
            raise ValueError(
                f"replicas must be between 0 and 100 (replicas that must acknowledge each "
                f"acquisition; 0 or None turns WAIT off), got {replicas}"
            )
    timeout = check_lease(replica_timeout, "replica_timeout")
    if on_replica_shortfall not in _SHORTFALL_CHOICES:
        raise ValueError(
            f"on_replica_shortfall must be 'raise' (undo the acquisition and raise "
            f"ReplicaAckError) or 'warn' (keep it and log a warning), got "
            f"{on_replica_shortfall!r}"
        )
    if not replicas:
        return None
    if command_timeout is not None and timeout >= command_timeout:
        raise ValueError(
            f"replica_timeout ({timeout} s) must be shorter than command_timeout "
            f"({command_timeout} s): WAIT blocks the acquire's round trip for up to "
            "replica_timeout, which would then time out before WAIT answers"
        )
    return ReplicaPolicy(replicas, timeout, on_replica_shortfall)  # type: ignore[arg-type]


class Acknowledgement:
    """What WAIT answered for the script calls of one attempt (set by the client)."""

    __slots__ = ("acked", "policy", "refused")

    def __init__(self, policy: ReplicaPolicy) -> None:
        self.policy = policy
        #: the fewest replicas any WAIT of the attempt reported (None: none sent yet)
        self.acked: int | None = None
        #: WAIT's error reply, if the server refused it
        self.refused: rex.RedisError | None = None

    def record(self, reply: object) -> None:
        if isinstance(reply, rex.RedisError):
            self.refused = reply
        elif isinstance(reply, int):
            self.acked = reply if self.acked is None else min(self.acked, reply)


#: Set while a task's attempt runs: the client then appends WAIT to each script call of
#: that task on the same connection. A context variable, so that the kinds stay unaware.
ACKNOWLEDGE: ContextVar[Acknowledgement | None] = ContextVar("aiolock_acknowledge", default=None)


async def acknowledged(
    attempt: Callable[[], Awaitable[T]],
    policy: ReplicaPolicy,
    what: str,
    *,
    granted: Callable[[T], bool],
) -> T:
    """Run *attempt* (an acquire, called here), with WAIT after its script; raise if too
    few replicas acknowledged an outcome that *granted* says is a grant.

    *what* names the lock in errors (``"lock 'name'"``). On :class:`ReplicaAckError` the
    caller (the engine) undoes the attempt, as for an attempt whose outcome is unknown.
    """
    ack = Acknowledgement(policy)
    token = ACKNOWLEDGE.set(ack)
    try:
        # Called only now: the client reads ACKNOWLEDGE when the script call is made.
        outcome = await attempt()
    finally:
        ACKNOWLEDGE.reset(token)
    if ack.refused is not None:
        raise ReplicaAckError(
            f"Redis refused WAIT after the acquire of {what} "
            f"({ack.refused}); some hosted services do not offer WAIT, or an ACL forbids "
            "it. Allow WAIT for this user, or create the LockManager without replicas= "
            "(or with replicas=0) to acquire without replica acknowledgement"
        )
    if not granted(outcome) or ack.acked is None:
        return outcome
    if ack.acked >= policy.replicas:
        return outcome
    shortfall = (
        f"only {ack.acked} of the {policy.replicas} replicas asked for (replicas=) "
        f"acknowledged the acquisition of {what} within "
        f"{policy.timeout} s (replica_timeout)"
    )
    if policy.on_shortfall == "warn":
        logger.warning("%s; keeping it (on_replica_shortfall='warn')", shortfall)
        return outcome
    raise ReplicaAckError(
        f"{shortfall}, so it was undone: a failover now could lose it. Check the replicas' "
        "link to the primary (INFO replication), lower replicas=, raise replica_timeout, "
        "or pass on_replica_shortfall='warn' to keep such acquisitions"
    )


class _Inherit:
    """A handle made without ``replicas=``: its acquisitions follow the manager's."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<the manager's replicas=>"


INHERIT = _Inherit()
#: A handle's own ``replicas=`` (a policy, or None: no WAIT), or INHERIT.
HandlePolicy = ReplicaPolicy | None | _Inherit

#: The policy of the handle whose acquire runs in this task: set by the handle around
#: its call into the engine, read by the engine where it sends the attempt and where it
#: decides whether a release may hand the lock to a local waiter (a hand-over is a grant
#: that no WAIT follows). A context variable, so that no engine signature changes and
#: concurrent acquires of other handles in other tasks never see it.
_HANDLE_POLICY: ContextVar[HandlePolicy] = ContextVar("aiolock_handle_replicas", default=INHERIT)
#: The handle's policy as set around this task's acquire (INHERIT when none is): the
#: variable's own getter, so the engine's fast path reads it without a call of ours.
handle_policy = _HANDLE_POLICY.get


def check_handle_replicas(
    replicas: object,
    replica_timeout: object,
    manager: ReplicaPolicy | None,
    command_timeout: float | None,
) -> HandlePolicy:
    """A factory's ``replicas=`` / ``replica_timeout=``: checked at the call.

    Neither given: INHERIT (the manager's). ``replicas=0``: no WAIT for this lock even if
    the manager has one. ``replica_timeout`` alone changes the manager's timeout for this
    lock, and needs ``replicas=`` here or on the manager. The manager's
    ``on_replica_shortfall`` applies.
    """
    if replicas is None and replica_timeout is None:
        return INHERIT
    if replicas is None and manager is None:
        raise ValueError(
            "replica_timeout= needs replicas= (on this lock or on the manager): it is how "
            "long WAIT may block an acquisition for that many replicas"
        )
    count = manager.replicas if replicas is None and manager is not None else replicas
    timeout = replica_timeout
    if timeout is None:
        timeout = manager.timeout if manager is not None else 1.0
    shortfall = manager.on_shortfall if manager is not None else "raise"
    return check_replica_options(count, timeout, shortfall, command_timeout)


def effective_policy(manager: ReplicaPolicy | None) -> ReplicaPolicy | None:
    """The policy for an acquisition in this task: its handle's, else the manager's."""
    policy = _HANDLE_POLICY.get()
    return manager if isinstance(policy, _Inherit) else policy


async def under_policy(policy: HandlePolicy, acquire: Awaitable[T]) -> T:
    """Await *acquire* (a handle's call into the engine) under the handle's policy."""
    if isinstance(policy, _Inherit):
        return await acquire
    token = _HANDLE_POLICY.set(policy)
    try:
        return await acquire
    finally:
        _HANDLE_POLICY.reset(token)
