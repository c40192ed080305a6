"""FastAPI integration: one LockManager per app, and a dependency that holds a lock.

::

    from fastapi import Depends, FastAPI
    from aiolock.contrib.fastapi import lock_dependency, lock_lifespan

    app = FastAPI(lifespan=lock_lifespan("redis://localhost:6379/0", prefix="shop"))

    @app.post("/orders/{order_id}/pay")
    async def pay(
        order_id: int,
        lock=Depends(lock_dependency("order:{order_id}", timeout=5), scope="function"),
    ) -> dict[str, int]:
        return {"fencing_token": lock.fencing_token}

``scope="function"`` is required (FastAPI >= 0.121): with the default scope the code
after a dependency's ``yield`` runs *after the response is sent* (FastAPI >= 0.118), so a
lock lost during the endpoint would be found too late, after a 200 went out. In function
scope the lock is released, and a loss turned into an error response, before the
response is sent. A lock dependency in the default scope is refused: at startup by
:func:`lock_lifespan`, and with a 500 at the first request otherwise.

Status codes: the lock busy past ``timeout`` -> 423 (``timeout_status``); the lock lost
while the endpoint ran -> 409 (``lost_status``); Redis unreachable or refusing, or the
manager closed or stopped by the server's SIGTERM -> 503 (``unavailable_status``, with
``Retry-After``); a lock name that is not valid (say, a
query parameter of 5000 bytes) -> 422; the client gone while the request waited for the
lock -> 499 (uvicorn and FastAPI never cancel such a request: the dependency watches).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import string
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NoReturn

from aiolock._decorators import LOCK_MAKERS, LockKindName, check_spec, distinct
from aiolock._errors import LockBackendError, LockLostError, LockTimeoutError, ManagerNotOpenError
from aiolock._keys import check_lease, check_timeout
from aiolock._manager import LockManager
from aiolock.contrib._disconnect import CLIENT_LEFT_STATUS, ClientWatch
from aiolock.contrib._shutdown import RETRY_AFTER, StopOnSignals
from aiolock.contrib._source import (
    ManagerSource,
    check_source,
    check_statuses,
    make_manager,
    missing,
)

try:
    from fastapi import Depends, HTTPException, Request
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect
    from starlette.responses import StreamingResponse
    from starlette.types import Receive, Scope, Send
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing("fastapi", exc) from exc

__all__ = [
    "STATE_KEY",
    "check_lock_scopes",
    "get_lock_manager",
    "lock_dependency",
    "lock_lifespan",
    "locked_streaming_response",
]

logger = logging.getLogger("aiolock")

if "scope" not in inspect.signature(Depends).parameters:  # pragma: no cover - old FastAPI
    raise ImportError(
        "aiolock.contrib.fastapi needs FastAPI >= 0.121 (for Depends(..., scope='function')); "
        "upgrade it with: pip install -U 'aiolock[fastapi]'"
    )

#: The name under which the lifespan publishes the manager: in the lifespan state
#: (``request.state.aiolock``, seen by mounted sub-apps too) and on ``app.state.aiolock``.
STATE_KEY = "aiolock"

#: Marks the callables made by lock_dependency(), for the scope check.
_MARK = "__aiolock_lock_dependency__"


# -- the manager --------------------------------------------------------------------------


def lock_lifespan(
    source: ManagerSource, **options: Any
) -> Callable[[Starlette], AbstractAsyncContextManager[dict[str, Any]]]:
    """A lifespan that opens one manager for the app at startup and closes it at shutdown.

    *source* is a Redis URL (the manager is ``LockManager.from_url(url, **options)``, with
    a client of its own, closed with it), a function returning a new manager, or a
    manager (which opens once: an app that starts twice needs one of the other two).
    Startup also runs :func:`check_lock_scopes`, and hooks SIGTERM and SIGINT beside the
    server's own handlers: at the signal the manager stops acquiring, so requests waiting
    for a lock get a 503 with ``Retry-After`` at once, while holders finish within the
    server's grace time (see ``docs/recipes/fastapi.md``). The manager is published as
    ``app.state.aiolock`` and in the lifespan state; :func:`get_lock_manager` finds it.

    With a lifespan of your own, enter this one inside it::

        @asynccontextmanager
        async def lifespan(app):
            async with lock_lifespan(url)(app) as state:
                ...  # your startup
                yield state
    """

    check_source(source, options)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        check_lock_scopes(app)
        manager = make_manager(source, dict(options))
        await manager.open()
        setattr(app.state, STATE_KEY, manager)
        # At the server's SIGTERM, not at the lifespan's shutdown (which comes after the
        # grace time): waiting requests get a 503 instead of the server's 500.
        signals = StopOnSignals(manager.stop_acquiring)
        signals.install()
        try:
            yield {STATE_KEY: manager}
        finally:
            signals.remove()
            try:
                await manager.aclose()
            finally:
                if getattr(app.state, STATE_KEY, None) is manager:
                    delattr(app.state, STATE_KEY)

    return lifespan


def get_lock_manager(request: Request) -> LockManager:
    """A dependency returning the app's manager (``locks = Depends(get_lock_manager)``).

    Looks in the lifespan state, then on ``request.app.state``; raises ``RuntimeError``
    (a 500) if neither has one.
    """
    for holder in (request.state, request.app.state):
        manager = getattr(holder, STATE_KEY, None)
        if isinstance(manager, LockManager):
            return manager
    raise RuntimeError(
        "no LockManager for this app: create the app with "
        "FastAPI(lifespan=aiolock.contrib.fastapi.lock_lifespan(redis_url)), or set "
        f"app.state.{STATE_KEY} to an open LockManager"
    )


# -- the dependency -----------------------------------------------------------------------


def lock_dependency(
    name: str | Sequence[str],
    *,
    timeout: float | None = None,
    lease: float | None = None,
    kind: LockKindName = "lock",
    types: Mapping[str, Any] | None = None,
    timeout_status: int = 423,
    lost_status: int = 409,
    unavailable_status: int = 503,
    manager: LockManager | None = None,
    watch_disconnect: bool = True,
    cancel_on_disconnect: bool = False,
) -> Callable[..., AsyncIterator[Any]]:
    """A dependency that holds the lock *name* while the endpoint runs; use it with
    ``Depends(lock_dependency(...), scope="function")``.

    *name* is a template whose fields are the request's path or query parameters, by
    name (``"order:{order_id}"``); each field becomes a parameter of the dependency, a
    ``str`` unless *types* gives another type (``types={"order_id": int}`` makes
    ``/orders/042`` and ``/orders/42`` the same lock, and rejects ``/orders/x`` with
    422). A list of templates takes a multi-lock. *kind* is ``"lock"``, ``"fair"``,
    ``"read"`` or ``"write"``, as in :meth:`LockManager.locked`.

    The dependency yields the handle (``lock.fencing_token`` is the hold's token). The
    lock is acquired before the endpoint runs (waiting up to *timeout*, ``None``: as long
    as it takes) and released when it returns, before the response is sent. A loss while
    the endpoint runs cancels it; a loss found at release also counts. Errors become
    ``HTTPException``: *timeout_status* (423) when the lock stays busy, *lost_status*
    (409) when it was lost, *unavailable_status* (503) when Redis fails or the manager is
    closed, 422 when the formatted name is not a valid lock name.

    *manager* overrides the app's manager (by default :func:`get_lock_manager`'s).

    Client disconnects: uvicorn and FastAPI never cancel an endpoint whose client left.
    With *watch_disconnect* (the default) the dependency watches the ASGI ``receive``
    channel while it waits: a client that disconnects stops the wait (the request ends
    with 499, which nobody reads), so it never takes the lock later to run the endpoint
    for nobody. To watch, it reads the request body first (Starlette keeps it for the
    endpoint); an endpoint that streams a large upload should pass
    ``watch_disconnect=False``. With *cancel_on_disconnect* the watch goes on while the
    endpoint runs and cancels it (then releases the lock) if the client leaves; leave
    it off for work that must finish once started.
    """
    if kind not in LOCK_MAKERS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, LOCK_MAKERS))}, got {kind!r}")
    single = isinstance(name, str)
    templates = [name] if isinstance(name, str) else list(name)
    if not templates or not all(isinstance(t, str) for t in templates):
        raise TypeError(f"lock_dependency() needs a name template (str) or a list, got {name!r}")
    if not single and kind != "lock":
        raise TypeError(f"a list of names makes a multi-lock, which kind={kind!r} is not")
    timeout = check_timeout(timeout)
    if lease is not None:
        lease = check_lease(lease)
    check_statuses(timeout_status, lost_status, unavailable_status)
    fields = _fields(templates)
    types = dict(types or {})
    unknown = sorted(set(types) - set(fields))
    if unknown:
        raise ValueError(
            f"types names {', '.join(map(repr, unknown))}, which the name template "
            f"{name!r} does not use"
        )
    make = LOCK_MAKERS[kind]
    # Routes whose scopes were checked (routes are not hashable: by id, with a weak
    # reference that tells a new route at a reused id).
    checked_routes: dict[int, weakref.ref[Any]] = {}

    async def hold_lock(request: Request, **values: Any) -> AsyncIterator[Any]:
        route = request.scope.get("route")
        seen = checked_routes.get(id(route))
        if route is not None and (seen is None or seen() is not route):
            _check_route(route)
            checked_routes[id(route)] = weakref.ref(route)
        locks = manager if manager is not None else get_lock_manager(request)
        formatted = distinct([template.format_map(values) for template in templates])
        try:
            handle = make(locks, formatted[0] if single else formatted, timeout, lease)
        except ValueError as exc:  # a name too long, say, from a client's parameter
            raise HTTPException(422, detail=f"not a valid lock name: {exc}") from exc
        watch = await _watch_client(request) if watch_disconnect else None
        try:
            await handle.__aenter__()
        except LockTimeoutError as exc:
            await _settle(watch, exc)
            raise HTTPException(
                timeout_status, detail=f"{_describe(formatted)} is busy; try again later"
            ) from exc
        except (LockBackendError, ManagerNotOpenError) as exc:
            await _settle(watch, exc)
            raise HTTPException(
                unavailable_status,
                detail="the lock service is unavailable; try again later",
                headers={"Retry-After": RETRY_AFTER},
            ) from exc
        except LockLostError as exc:  # lost before the endpoint ran: nothing was done
            await _settle(watch, exc)
            logger.warning("%s was lost before the endpoint ran: %s", _describe(formatted), exc)
            raise HTTPException(
                lost_status,
                detail=f"{_describe(formatted)} was lost before the request ran; nothing "
                "was done: try again",
            ) from exc
        except asyncio.CancelledError as exc:
            await _settle(watch, exc)  # the client left: 499 (else the cancellation goes on)
            raise
        if watch is not None and not cancel_on_disconnect:
            watch.stop()
            if await watch.settle(None):  # it left just as the lock was granted
                await _exit(handle, None, formatted, lost_status, unavailable_status)
                _client_left("got the lock")
            watch = None
        # What ``async with`` does, split around the yield. The guard's block, entered by
        # __aenter__, spans the endpoint: a loss cancels it, and the CancelledError comes
        # back here, where __aexit__ turns it into LockLostError.
        try:
            yield handle
        except BaseException as exc:
            if watch is not None:
                watch.stop()
                if await watch.settle(exc):  # the client left: the endpoint was cancelled
                    await _exit(handle, exc, formatted, lost_status, unavailable_status)
                    _client_left("ran")
            await _exit(handle, exc, formatted, lost_status, unavailable_status)
            raise
        if watch is not None:
            watch.stop()
            await watch.settle(None)  # left at the very end: the endpoint finished anyway
        await _exit(handle, None, formatted, lost_status, unavailable_status)

    parameters = [
        inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)
    ]
    parameters += [
        inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, annotation=types.get(field, str))
        for field in fields
    ]
    # FastAPI reads the parameters to inject from the signature: the template's fields.
    hold_lock.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    hold_lock.__name__ = hold_lock.__qualname__ = f"lock_dependency({name!r})"
    setattr(hold_lock, _MARK, True)
    return hold_lock


async def _watch_client(request: Request) -> ClientWatch:
    """Read the body (Starlette keeps it for the endpoint), then watch for the client
    leaving: the next ASGI message is ``http.disconnect``."""
    try:
        await request.body()
    except ClientDisconnect:
        _client_left("waited")  # gone while sending the body
    except RuntimeError:
        pass  # already read as a stream (a form): only the disconnect is left to receive

    async def left() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    return ClientWatch(left)


async def _settle(watch: ClientWatch | None, exc: BaseException) -> None:
    """After a failed acquire: if the client left meanwhile, end the request with 499."""
    if watch is not None:
        watch.stop()
        if await watch.settle(exc):
            _client_left("waited")


def _client_left(what: str) -> NoReturn:
    raise HTTPException(
        CLIENT_LEFT_STATUS, detail=f"the client disconnected while the request {what}"
    )


async def _exit(
    handle: Any,
    exc: BaseException | None,
    names: list[str],
    lost_status: int,
    unavailable_status: int,
) -> None:
    """Leave the handle's ``async with``; a loss becomes *lost_status*."""
    try:
        if exc is None:
            await handle.__aexit__(None, None, None)
        else:
            await handle.__aexit__(type(exc), exc, exc.__traceback__)
    except LockLostError as lost:
        logger.warning("%s was lost while the endpoint ran: %s", _describe(names), lost)
        raise HTTPException(
            lost_status,
            detail=f"{_describe(names)} was lost while the request ran; its effects may "
            "have overlapped another request's: check, then retry",
        ) from lost
    except LockBackendError as failed:
        raise HTTPException(
            unavailable_status,
            detail="the lock service failed; try again later",
            headers={"Retry-After": RETRY_AFTER},
        ) from failed


def _describe(names: list[str]) -> str:
    return f"lock {names[0]!r}" if len(names) == 1 else f"locks {names!r}"


def _fields(templates: list[str]) -> list[str]:
    """The parameter names of the templates, in order, each once; plain names only."""
    fields: list[str] = []
    for template in templates:
        for _, field, spec, _ in string.Formatter().parse(template):
            if field is None:
                continue
            check_spec(template, field, spec)
            if not field.isidentifier():
                raise ValueError(
                    f"name template {template!r}: the field {{{field}}} must be the name of "
                    "a path or query parameter, like 'order:{order_id}'"
                )
            if field == "request":
                raise ValueError(
                    f"name template {template!r}: 'request' is not usable as a field name"
                )
            if field not in fields:
                fields.append(field)
    return fields


# -- streaming responses ------------------------------------------------------------------


async def locked_streaming_response(
    handle: AbstractAsyncContextManager[Any],
    content: AsyncIterable[bytes | str],
    *,
    timeout_status: int = 423,
    unavailable_status: int = 503,
    **options: Any,
) -> StreamingResponse:
    """Acquire *handle* now, and return a ``StreamingResponse`` of *content* that holds
    it until the stream ends, fails, or the client leaves.

    ``return await locked_streaming_response(locks.lock("export"), rows(), media_type=...)``.
    A busy lock is a *timeout_status* (423) and Redis failing a *unavailable_status*
    (503), before anything is sent. The lock is released, and *content* closed, when
    the response is done, however it ends: Starlette cancels a stream whose client left
    without closing its body, so a lock held inside the body generator itself would
    wait for the task's end or the garbage collector. A loss while streaming cancels
    the stream (the client sees it cut short) and raises ``LockLostError`` from the
    response. *options* are ``StreamingResponse``'s (``media_type``, ``headers``, ...).
    """
    check_statuses(timeout_status, 409, unavailable_status)
    try:
        await handle.__aenter__()
    except LockTimeoutError as exc:
        raise HTTPException(timeout_status, detail="the lock is busy; try again later") from exc
    except (LockBackendError, ManagerNotOpenError) as exc:
        raise HTTPException(
            unavailable_status, detail="the lock service is unavailable; try again later"
        ) from exc
    return _LockedStreamingResponse(handle, content, **options)


class _LockedStreamingResponse(StreamingResponse):
    """A ``StreamingResponse`` that leaves its lock's ``async with`` when it is done."""

    def __init__(
        self, handle: AbstractAsyncContextManager[Any], content: AsyncIterable[bytes | str],
        **options: Any,
    ) -> None:  # fmt: skip
        super().__init__(content, **options)
        self._handle = handle
        self._content = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        failure: BaseException | None = None
        try:
            await super().__call__(scope, receive, send)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            try:
                await self._close()
            finally:
                if failure is None:
                    await self._handle.__aexit__(None, None, None)
                else:
                    await self._handle.__aexit__(type(failure), failure, failure.__traceback__)

    async def _close(self) -> None:
        """Close the body: blocks of its own (a lock it holds itself) end here too."""
        aclose = getattr(self._content, "aclose", None)
        if aclose is not None:
            await aclose()


# -- the scope check ----------------------------------------------------------------------


def check_lock_scopes(app: Starlette) -> None:
    """Raise ``RuntimeError`` if a route uses a lock dependency outside function scope,
    or one whose name template has a field the route declares as neither a path
    parameter nor a query parameter (a typo such as ``{oder_id}`` would otherwise become
    a required query parameter of its own, and every request would get a 422).

    :func:`lock_lifespan` runs it at startup; the dependency runs it for its route at
    its first request too.
    """
    for route in app.routes:
        _check_route(route)


def _check_route(route: Any) -> None:
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    found_locks = _lock_dependants(dependant)
    declared = _declared_queries(dependant)
    for found in found_locks:
        _check_fields(route, found, declared)
        if found.scope != "function":
            path = getattr(route, "path", "?")
            raise RuntimeError(
                f"route {path!r} uses {found.call.__name__} with the default dependency "
                "scope, in which FastAPI releases it after the response is sent (so a lost "
                "lock could not turn the response into an error); declare it with "
                "Depends(lock_dependency(...), scope='function')"
            )


def _check_fields(route: Any, found: Any, declared: set[str]) -> None:
    """Refuse a lock dependency whose field is a query parameter only it declares."""
    for param in found.query_params:
        if param.alias not in declared:
            path = getattr(route, "path", "?")
            raise RuntimeError(
                f"route {path!r}: {found.call.__name__} names the field {{{param.alias}}}, "
                "which is neither a path parameter of the route nor a query parameter its "
                "endpoint or other dependencies declare (FastAPI would make it a required "
                "query parameter of its own, and requests without it would get a 422); fix "
                "the field's name, or declare the query parameter on the endpoint"
            )


def _declared_queries(dependant: Any) -> set[str]:
    """The query parameters a route declares outside its lock dependencies."""
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        if not getattr(sub.call, _MARK, False):
            names |= _declared_queries(sub)
    return names


def _lock_dependants(dependant: Any) -> list[Any]:
    found = []
    for sub in dependant.dependencies:
        if getattr(sub.call, _MARK, False):
            found.append(sub)
        found.extend(_lock_dependants(sub))
    return found
