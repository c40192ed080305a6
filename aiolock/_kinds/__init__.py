"""Lock kinds: one module per kind, each implementing :class:`aiolock._kind.LockKind`."""

from .fair import FairLockKind
from .lock import ReentrantLockKind
from .rw import ReadLockKind, WriteLockKind
from .semaphore import SemaphoreKind

__all__ = ["FairLockKind", "ReadLockKind", "ReentrantLockKind", "SemaphoreKind", "WriteLockKind"]
