"""Singleton arq jobs: at most one job per resource runs at a time; losers are deferred.

``pip install aiolock[arq]``. Put an open :class:`~aiolock.LockManager` in the worker's
context (``ctx["locks"]``, in ``on_startup``) and decorate the job::

    @singleton("report:{customer_id}")                  # defer by default
    async def build_report(ctx: dict, customer_id: int) -> str: ...

A job that finds the lock held raises ``arq.worker.Retry(defer=...)``: arq runs it again
after ``defer`` seconds, up to the worker's ``max_tries`` (then the job fails with
arq's "max retries exceeded"). ``on_busy="skip"`` returns ``None`` instead, ``"raise"``
fails the job with :class:`~aiolock.contrib.jobs.JobBusy`, and a handler
``(busy, arguments)`` decides itself. The holder record names arq's job id
(``ctx["job_id"]``); :func:`~aiolock.contrib.jobs.holder_info` reads it. See
docs/recipes/arq.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn, ParamSpec, TypeVar

from aiolock._manager import LockManager
from aiolock.contrib import jobs

try:
    from arq.worker import Retry
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("aiolock.contrib.arq needs arq: pip install 'aiolock[arq]'") from exc

__all__ = ["singleton"]

P = ParamSpec("P")
R = TypeVar("R")


def singleton(
    name: str,
    *,
    locks: LockManager | str = "locks",
    on_busy: jobs.OnBusy = "defer",
    defer: float = 5.0,
    job_id: jobs.JobIdArg = "{ctx[job_id]}",
    timeout: float | None = 0.0,
    lease: float | None = None,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[Any]]]:
    """:func:`aiolock.contrib.jobs.singleton` for arq jobs (first parameter ``ctx``).

    Args:
        locks: the manager, or the key of the worker context that holds it.
        on_busy: ``"defer"`` (default: ``Retry(defer=defer)``), ``"skip"``, ``"raise"``
            or a handler ``(busy, arguments)``.
    """
    if isinstance(locks, str):
        key = locks

        def find(arguments: Mapping[str, Any]) -> LockManager:
            ctx = arguments.get("ctx")
            if not isinstance(ctx, Mapping) or not isinstance(ctx.get(key), LockManager):
                raise LookupError(
                    f"aiolock.contrib.arq.singleton: no LockManager at ctx[{key!r}]; open one "
                    f"in the worker's on_startup and store it there, or pass locks=manager"
                )
            manager: LockManager = ctx[key]
            return manager

        where: jobs.LocksArg = find
    else:
        where = locks
    if on_busy == "defer":

        def retry(busy: jobs.JobBusy, arguments: Mapping[str, Any]) -> NoReturn:
            # arq re-enqueues the job to run after `defer`, counting it as a try.
            raise Retry(defer=defer) from busy

        on_busy = retry
    return jobs.singleton(
        where, name, on_busy=on_busy, job_id=job_id, timeout=timeout, lease=lease, defer=defer
    )
