"""Where an integration gets its LockManager from: a manager, a Redis URL or a factory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

from aiolock._manager import LockManager

__all__ = ["ManagerSource", "check_source", "check_statuses", "make_manager", "missing"]

#: A manager not yet opened, a Redis URL (``LockManager.from_url(url, **options)``), or a
#: function returning a new manager (called at each startup, so an app can start twice).
ManagerSource: TypeAlias = "LockManager | str | Callable[[], LockManager]"


def check_source(source: ManagerSource, options: dict[str, Any]) -> None:
    """Raise TypeError, at the call, if *options* come without a URL to apply them to."""
    if options and not isinstance(source, str):
        raise TypeError(
            f"manager options ({', '.join(sorted(options))}) go with a Redis URL only; "
            "give them to the LockManager (or the function making it) instead"
        )


def make_manager(source: ManagerSource, options: dict[str, Any]) -> LockManager:
    """The manager *source* stands for; *options* go to ``LockManager.from_url`` only."""
    if isinstance(source, str):
        return LockManager.from_url(source, **options)
    check_source(source, options)
    manager = source if isinstance(source, LockManager) else source()
    if not isinstance(manager, LockManager):
        raise TypeError(
            "the manager source must be a LockManager, a Redis URL or a function returning "
            f"a LockManager; got {manager!r}"
        )
    return manager


def missing(extra: str, exc: ImportError) -> ImportError:
    """The ImportError to raise when the framework of ``aiolock.contrib.<extra>`` is missing."""
    return ImportError(
        f"aiolock.contrib.{extra} needs a package that is not installed ({exc}); install "
        f"it with: pip install 'aiolock[{extra}]'"
    )


def check_statuses(*statuses: int) -> None:
    """Raise ValueError unless every one of *statuses* is an HTTP error code."""
    for status in statuses:
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError(f"status codes must be HTTP error codes (400-599), got {status!r}")
