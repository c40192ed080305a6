"""aiolock: asyncio distributed locks for Redis.

Reentrant per asyncio task, leases renewed in the background, waiters woken by pub/sub,
fencing tokens, and cancellation-safe acquire and release::

    async with aiolock.LockManager(Redis()) as locks:
        async with locks.lock("order:42") as lock:
            ...
"""

from ._errors import (
    LockBackendError,
    LockConnectionError,
    LockError,
    LockHandoffError,
    LockKeyTypeError,
    LockLostError,
    LockNotOwnedError,
    LockPermissionError,
    LockTimeoutError,
    ManagerNotOpenError,
    ReplicaAckError,
    WireFormatError,
)
from ._fair_lock import FairLock
from ._hub import HubStatistics
from ._leader import LeaderElection, LeaderTerm
from ._lock import Lock
from ._manager import LockManager, ManagerStatistics
from ._multi import MultiLock
from ._observe import Observer
from ._redlock import RedlockLock, RedlockManager, RedlockStatistics
from ._rwlock import ReadWriteLock
from ._semaphore import Permit, Semaphore

__version__ = "0.1.0.dev0"

__all__ = [
    "FairLock",
    "HubStatistics",
    "LeaderElection",
    "LeaderTerm",
    "Lock",
    "LockBackendError",
    "LockConnectionError",
    "LockError",
    "LockHandoffError",
    "LockKeyTypeError",
    "LockLostError",
    "LockManager",
    "LockNotOwnedError",
    "LockPermissionError",
    "LockTimeoutError",
    "ManagerNotOpenError",
    "ManagerStatistics",
    "MultiLock",
    "Observer",
    "Permit",
    "ReadWriteLock",
    "RedlockLock",
    "RedlockManager",
    "RedlockStatistics",
    "ReplicaAckError",
    "Semaphore",
    "WireFormatError",
    "__version__",
]
