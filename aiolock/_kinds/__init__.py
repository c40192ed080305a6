"""Lock kinds: one module per kind, each implementing :class:`aiolock._kind.LockKind`."""

from .lock import ReentrantLockKind
from .semaphore import SemaphoreKind

__all__ = ["ReentrantLockKind", "SemaphoreKind"]
