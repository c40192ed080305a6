"""Singleton taskiq tasks: at most one task per resource runs at a time; losers are deferred.

``pip install aiolock[taskiq]``. Give the task a ``Context`` parameter (taskiq injects
it) and decorate it under ``@broker.task``::

    @broker.task
    @singleton(locks, "report:{customer_id}")          # defer by default
    async def build_report(customer_id: int, context: Context = TaskiqDepends()) -> str: ...

A task that finds the lock held waits ``defer`` seconds and requeues itself
(``context.requeue()``, which stores no result for this run), at most ``max_requeues``
times, then fails with :class:`~aiolock.contrib.jobs.JobBusy`. ``on_busy="skip"``
returns ``None`` instead (the task's return annotation is widened to ``... | None``, so
taskiq parses a skipped run's result), ``"raise"`` fails the task, and a handler
``(busy, arguments)`` decides itself. ``on_busy="defer"`` and ``locks="<state attribute>"``
need the ``Context`` parameter; a task without one is refused when decorated. The holder
record names the task id; see docs/recipes/taskiq.md.
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from aiolock._manager import LockManager
from aiolock.contrib import jobs

try:
    from taskiq import Context
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("aiolock.contrib.taskiq needs taskiq: pip install 'aiolock[taskiq]'") from exc

__all__ = ["REQUEUE_LABEL", "find_context", "singleton"]

P = ParamSpec("P")
R = TypeVar("R")

#: The message label in which taskiq counts a task's requeues.
REQUEUE_LABEL = "X-Taskiq-requeue"


def find_context(arguments: Mapping[str, Any]) -> Context | None:
    """The taskiq ``Context`` among a call's arguments, if the task has one."""
    return next((v for v in arguments.values() if isinstance(v, Context)), None)


def _task_id(arguments: Mapping[str, Any]) -> str | None:
    context = find_context(arguments)
    return None if context is None else str(context.message.task_id)


def _from_state(attribute: str) -> Callable[[Mapping[str, Any]], LockManager]:
    def find(arguments: Mapping[str, Any]) -> LockManager:
        context = find_context(arguments)
        manager = None if context is None else getattr(context.state, attribute, None)
        if not isinstance(manager, LockManager):
            raise LookupError(
                f"aiolock.contrib.taskiq.singleton: no LockManager at the broker's "
                f"state.{attribute}; open one at startup and store it there (the task needs a "
                "'context: Context = TaskiqDepends()' parameter), or pass locks=manager"
            )
        return manager

    return find


def singleton(
    locks: jobs.LocksArg | str,
    name: str,
    *,
    on_busy: jobs.OnBusy = "defer",
    defer: float = 1.0,
    max_requeues: int = 30,
    job_id: jobs.JobIdArg = _task_id,
    timeout: float | None = 0.0,
    lease: float | None = None,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[Any]]]:
    """:func:`aiolock.contrib.jobs.singleton` for taskiq tasks.

    Args:
        locks: the manager, a function of the call's arguments that returns it, or the
            name of the attribute of the broker's ``state`` that holds it.
        on_busy: ``"defer"`` (default: wait ``defer`` seconds, then requeue, at most
            ``max_requeues`` times), ``"skip"``, ``"raise"`` or a handler.
        job_id: default: the task id, from the task's ``Context`` parameter.
    """
    if isinstance(max_requeues, bool) or not isinstance(max_requeues, int) or max_requeues < 0:
        raise ValueError(f"max_requeues must be an int >= 0, got {max_requeues!r}")
    # What the task's Context is needed for, checked at decoration (at run time the
    # task would fail only when the lock is busy, or with a LookupError on every run).
    needs = []
    if isinstance(locks, str):
        needs.append(f"locks={locks!r} finds the manager at context.state.{locks}")
    if on_busy == "defer":
        needs.append("on_busy='defer' requeues the task through context.requeue()")
    wrap = _singleton(locks, name, on_busy, defer, max_requeues, job_id, timeout, lease)

    def decorator(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[Any]]:
        if needs and inspect.iscoroutinefunction(function) and not _has_context(function):
            raise TypeError(
                f"aiolock.contrib.taskiq.singleton: {function.__qualname__}() has no Context "
                f"parameter, which it needs ({'; '.join(needs)}): add a parameter "
                "'context: Context = TaskiqDepends()'"
            )
        task = wrap(function)
        if on_busy == "skip":
            _may_return_none(task, function)
        return task

    return decorator


def _has_context(function: Callable[..., Any]) -> bool:
    """Whether taskiq will inject a ``Context`` into one of *function*'s parameters."""
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # an annotation that does not resolve here: read it as written
        hints = {}
    for parameter in inspect.signature(function).parameters.values():
        annotation = hints.get(parameter.name, parameter.annotation)
        if annotation is Context or getattr(parameter.default, "dependency", None) is Context:
            return True
        if isinstance(annotation, str) and annotation.rsplit(".", 1)[-1] == "Context":
            return True
    return False


def _may_return_none(task: Callable[..., Any], function: Callable[..., Any]) -> None:
    """Widen *task*'s return annotation to ``... | None``: a skipped run returns None,
    which taskiq would otherwise fail to parse as the declared type (and log so)."""
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # leave an annotation that does not resolve as it is
        return
    if "return" in hints:
        returned = hints["return"]
        # A new dict: functools.wraps shared the function's own.
        task.__annotations__ = {**hints, "return": typing.Union[returned, None]}  # noqa: UP007


def _singleton(
    locks: jobs.LocksArg | str,
    name: str,
    on_busy: jobs.OnBusy,
    defer: float,
    max_requeues: int,
    job_id: jobs.JobIdArg,
    timeout: float | None,
    lease: float | None,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[Any]]]:
    """:func:`jobs.singleton` with taskiq's requeue for ``on_busy="defer"``."""
    if on_busy == "defer":

        async def requeue(busy: jobs.JobBusy, arguments: Mapping[str, Any]) -> Any:
            context = find_context(arguments)
            if context is None:
                raise TypeError(
                    "aiolock.contrib.taskiq.singleton(on_busy='defer') requeues the task "
                    "through its Context: add a parameter 'context: Context = TaskiqDepends()'"
                ) from busy
            if int(context.message.labels.get(REQUEUE_LABEL, 0)) >= max_requeues:
                raise busy
            # Waiting here keeps the message in hand (taskiq has no delayed requeue
            # without a scheduler); it costs a task slot, not a thread.
            await asyncio.sleep(defer)
            await context.requeue()  # raises NoResultError: this run stores no result

        on_busy = requeue
    return jobs.singleton(
        _from_state(locks) if isinstance(locks, str) else locks,
        name,
        on_busy=on_busy,
        job_id=job_id,
        timeout=timeout,
        lease=lease,
        defer=defer,
    )
