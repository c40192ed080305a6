"""Decorators that run an async function under a lock or a semaphore permit.

``@locks.locked("order:{order_id}")`` formats the lock name from the call's arguments,
by parameter name (``{order.id}`` and ``{self.tenant}`` work too), acquires, runs the
function inside ``async with`` (so a lost lock cancels it and raises
:class:`~aiolock.LockLostError`), and releases. The template is checked when the
function is decorated: every field must name a parameter, and no field may nest in
another's format spec. A list of templates takes a multi-lock; names that format alike
(``["acct:{src}", "acct:{dst}"]`` with ``src == dst``) are locked once.

``on_busy`` says what a call does when the lock is held elsewhere:

* ``"wait"`` (default): wait up to ``timeout`` (``None``: as long as it takes), then
  raise :class:`~aiolock.LockTimeoutError`;
* ``"skip"``: do not run; return ``None`` (after waiting up to ``timeout``, default 0);
* ``"raise"``: raise :class:`~aiolock.LockTimeoutError` (after waiting up to
  ``timeout``, default 0).
"""

from __future__ import annotations

import functools
import inspect
import string
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, ParamSpec, TypeVar

from aiolock._errors import LockTimeoutError
from aiolock._keys import check_lease, check_timeout

__all__ = ["LOCK_MAKERS", "LockKindName", "OnBusy", "check_spec", "decorate", "distinct"]

P = ParamSpec("P")
R = TypeVar("R")

OnBusy = Literal["wait", "skip", "raise"]
_ON_BUSY = ("wait", "skip", "raise")
LockKindName = Literal["lock", "fair", "read", "write"]

#: A handle to enter for one call: (manager, formatted name(s), timeout, lease) -> handle.
Maker = Callable[[Any, Any, "float | None", "float | None"], Any]


def _lock(manager: Any, names: Any, timeout: float | None, lease: float | None) -> Any:
    if isinstance(names, str):
        return manager.lock(names, timeout=timeout, lease=lease)
    return manager.multi_lock(names, timeout=timeout, lease=lease)


def _fair(manager: Any, name: Any, timeout: float | None, lease: float | None) -> Any:
    return manager.fair_lock(name, timeout=timeout, lease=lease)


def _read(manager: Any, name: Any, timeout: float | None, lease: float | None) -> Any:
    return manager.rw_lock(name, timeout=timeout, lease=lease).read()


def _write(manager: Any, name: Any, timeout: float | None, lease: float | None) -> Any:
    return manager.rw_lock(name, timeout=timeout, lease=lease).write()


#: The handle maker of each ``kind=`` of :meth:`LockManager.locked`.
LOCK_MAKERS: dict[str, Maker] = {"lock": _lock, "fair": _fair, "read": _read, "write": _write}


def template_fields(template: str) -> list[str]:
    """The parameter names a name template refers to (``{order.id}`` -> ``order``)."""
    fields = []
    for _, field, spec, _ in string.Formatter().parse(template):
        if field is None:
            continue
        check_spec(template, field, spec)
        base = field.split(".", 1)[0].split("[", 1)[0]
        if not base or base.isdigit():
            raise ValueError(
                f"name template {template!r} has a positional field {{{field}}}; name the "
                "parameter instead, e.g. 'order:{order_id}'"
            )
        fields.append(base)
    return fields


def check_spec(template: str, field: str, spec: str | None) -> None:
    """Refuse a field nested in a format spec (``{a:{b}}``): it is filled at call time
    from a value the decoration-time check never saw, so a mistake would surface as a
    KeyError on the first call instead of here."""
    if spec and ("{" in spec or "}" in spec):
        raise ValueError(
            f"name template {template!r} nests a field in the format spec of {{{field}}} "
            f"({{{field}:{spec}}}); write the spec out, e.g. '{{{field}:>4}}', or put the "
            "other value in a field of its own"
        )


def distinct(names: list[str]) -> list[str]:
    """*names* in order, each once: ``["acct:{src}", "acct:{dst}"]`` called with
    ``src == dst`` locks that one account once (a multi-lock refuses a name twice)."""
    return list(dict.fromkeys(names))


def decorate(
    manager: Any,
    names: str | Sequence[str],
    make: Maker,
    *,
    timeout: float | None,
    lease: float | None,
    on_busy: OnBusy,
    what: str,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]:
    """The decorator behind :meth:`LockManager.locked` and :meth:`LockManager.limited`.

    *make* returns the handle to enter for one call, given *manager* (typed loosely: this
    module must not import the manager, which imports it) and the formatted name(s).
    """
    if on_busy not in _ON_BUSY:
        raise ValueError(
            f"on_busy must be one of {', '.join(map(repr, _ON_BUSY))}, got {on_busy!r}"
        )
    templates = [names] if isinstance(names, str) else list(names)
    if not templates or not all(isinstance(t, str) for t in templates):
        raise TypeError(f"{what} needs a name template (str) or a list of them, got {names!r}")
    # "skip" and "raise" make one attempt unless told to wait.
    timeout = check_timeout(timeout) if timeout is not None or on_busy == "wait" else 0.0
    if lease is not None:
        lease = check_lease(lease)
    fields = [field for template in templates for field in template_fields(template)]

    def decorator(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R | None]]:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(
                f"{what} decorates async functions (async def); {function!r} is not one"
            )
        signature = inspect.signature(function)
        missing = [field for field in fields if field not in signature.parameters]
        if missing:
            raise TypeError(
                f"{what}: the name template {names!r} refers to {', '.join(map(repr, missing))}, "
                f"which {function.__qualname__}() has no parameter for; its parameters are "
                f"{', '.join(signature.parameters) or 'none'}"
            )

        @functools.wraps(function)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            formatted = distinct([template.format_map(bound.arguments) for template in templates])
            handle = make(manager, formatted[0] if isinstance(names, str) else formatted,
                          timeout, lease)  # fmt: skip
            try:
                await handle.__aenter__()
            except LockTimeoutError:
                if on_busy == "skip":
                    return None
                raise
            # What ``async with`` does, after an __aenter__ of our own (so that a
            # LockTimeoutError of the body itself is never mistaken for a busy lock). The
            # guard's exit never swallows an exception: a loss becomes LockLostError.
            try:
                result = await function(*args, **kwargs)
            except BaseException as exc:
                await handle.__aexit__(type(exc), exc, exc.__traceback__)
                raise
            await handle.__aexit__(None, None, None)
            return result

        return wrapper

    return decorator
