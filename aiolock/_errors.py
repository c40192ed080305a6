"""Exceptions raised by aiolock.

Everything aiolock raises on purpose derives from :class:`LockError`, except bad
arguments, which raise the built-in ``ValueError`` / ``TypeError`` at the call::

    LockError
    ├── LockTimeoutError       (also a TimeoutError) the wait ran out
    ├── LockNotOwnedError      release/extend of a hold the current task does not have
    │   ├── LockLostError      the task held the lock, and its lease was lost
    │   └── LockHandoffError   a detached hold's token no longer holds the lock (adopt)
    ├── LockKeyTypeError       a lock's key holds a value of another Redis type
    ├── ManagerNotOpenError    (also a RuntimeError) the LockManager is not open
    ├── IncompatibleLayoutError  a manager of another key layout is open on the prefix
    ├── WireFormatError        the chosen wire format cannot express this lock or feature
    ├── ReplicaAckError        too few replicas acknowledged an acquisition (replicas=)
    └── LockBackendError       Redis failed: unreachable, refused or errored
        ├── LockConnectionError    connecting, sending or reading timed out or failed
        └── LockPermissionError    authentication failed, or an ACL forbids a command

Backend errors are chained (``raise ... from``) from the redis-py exception that caused
them, so the original is always at hand in ``__cause__``.
"""

from __future__ import annotations

__all__ = [
    "IncompatibleLayoutError",
    "LockBackendError",
    "LockConnectionError",
    "LockError",
    "LockHandoffError",
    "LockKeyTypeError",
    "LockLostError",
    "LockNotOwnedError",
    "LockPermissionError",
    "LockTimeoutError",
    "ManagerNotOpenError",
    "ReplicaAckError",
    "WireFormatError",
]


class LockError(Exception):
    """Root of every error aiolock raises about locks and their backend."""


class LockTimeoutError(LockError, TimeoutError):
    """The lock could not be acquired within the given timeout."""


class LockNotOwnedError(LockError):
    """The current task does not hold the lock it tried to release or extend."""


class LockLostError(LockNotOwnedError):
    """A hold was lost while the task believed it held the lock.

    The lease expired, an administrator force-released the lock, or the key was
    replaced, so another owner may now be inside the critical section. Raised from the
    ``async with`` whose body was cancelled because of the loss, or from the next
    ``release()`` / ``extend()`` outside ``async with``.
    """


class LockHandoffError(LockNotOwnedError):
    """A hand-off token could not be adopted: the detached hold it names is gone.

    It was adopted already (a token is adopted once), its lease ran out before anyone
    adopted it, or the lock was force-released. Raised by :meth:`aiolock.Lock.adopt`;
    nothing is held when it is raised.
    """


class LockKeyTypeError(LockError):
    """A lock's Redis key holds a value that aiolock did not write (another type)."""


class ManagerNotOpenError(LockError, RuntimeError):
    """The LockManager is not open: enter it with ``async with`` first."""


class IncompatibleLayoutError(LockError):
    """A manager could not open: a manager of another key layout is open on its prefix.

    Managers of two layouts (two aiolock builds that name or shape their keys differently)
    do not exclude each other: each would take its own key for one lock name, and both
    would hold it. Every manager announces its layout in its identity record, and one
    that finds a live record of another layout under its prefix refuses to open, naming
    that manager (host, pid, name), both layouts and what to do. The manager stays
    unopened and may be opened again. See ``docs/wire-formats.md`` (upgrading).
    """


class WireFormatError(LockError):
    """The manager's (or lock's) wire format cannot express the lock kind or feature asked for.

    Raised at the call that asked for it (``fair_lock()``, ``fencing_token``, ...), naming
    the format and what to use instead.
    """


class ReplicaAckError(LockError):
    """Fewer replicas than ``replicas=`` acknowledged an acquisition within ``replica_timeout``.

    The acquisition was undone before this was raised (the lock is not held), unless the
    manager was told to keep it (``on_replica_shortfall="warn"``). Also raised when the
    server refuses ``WAIT`` (some hosted services do), saying how to turn it off.
    """


class LockBackendError(LockError):
    """Redis could not serve a request; the redis-py exception is ``__cause__``."""


class LockConnectionError(LockBackendError):
    """Connecting to Redis, or a command's round trip, failed or timed out."""


class LockPermissionError(LockBackendError):
    """Redis refused the client: a wrong password, or an ACL rule forbids a command or key."""
