"""Lock kinds: one module per kind, each implementing :class:`aiolock._kind.LockKind`."""

from .lock import ReentrantLockKind

__all__ = ["ReentrantLockKind"]
