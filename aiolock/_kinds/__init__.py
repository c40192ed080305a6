"""Lock kinds: one module per kind, each implementing :class:`aiolock._kind.LockKind`."""

from .fair import FairLockKind
from .lock import ReentrantLockKind

__all__ = ["FairLockKind", "ReentrantLockKind"]
