"""aiolock: asyncio distributed locks for Redis.

Reentrant per asyncio task, leases renewed in the background, waiters woken by pub/sub,
fencing tokens, and cancellation-safe acquire and release::

    async with aiolock.LockManager(Redis()) as locks:
        async with locks.lock("order:42") as lock:
            ...
"""

from aiolock._engine.contention import NameStatistics
from aiolock._engine.lockhandle import Lock
from aiolock._engine.waiter import HubStatistics
from aiolock._errors import (
    IncompatibleLayoutError,
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
from aiolock._kinds.fair.handle import FairLock
from aiolock._kinds.multi.handle import MultiLock
from aiolock._kinds.rw.handle import ReadWriteLock
from aiolock._kinds.semaphore.handle import Permit, Semaphore
from aiolock._leader import LeaderElection, LeaderTerm
from aiolock._manager import LockManager, ManagerStatistics
from aiolock._observe import Observer
from aiolock._redlock.manager import RedlockLock, RedlockManager, RedlockStatistics

__version__ = "0.1.0.dev0"

__all__ = [
    "FairLock",
    "HubStatistics",
    "IncompatibleLayoutError",
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
    "NameStatistics",
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
