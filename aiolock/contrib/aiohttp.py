"""aiohttp integration: one LockManager per ``web.Application``, found under an AppKey.

::

    from aiohttp import web
    from aiolock.contrib.aiohttp import LOCK_MANAGER, lock_error_middleware, lock_manager_ctx

    async def pay(request: web.Request) -> web.Response:
        locks = request.app[LOCK_MANAGER]
        async with locks.lock(f"order:{request.match_info['order_id']}", timeout=5) as lock:
            return web.json_response({"fencing_token": lock.fencing_token})

    app = web.Application(middlewares=[lock_error_middleware()])
    app.cleanup_ctx.append(lock_manager_ctx("redis://localhost:6379/0", prefix="shop"))
    app.router.add_post("/orders/{order_id}/pay", pay)

A handler's ``async with`` ends before it returns its response, so a lost lock raises
:class:`~aiolock.LockLostError` from the handler, never after the response went out;
:func:`lock_error_middleware` turns it (and timeouts, and Redis failures) into a status.

Client disconnects: ``web.run_app`` does not cancel a handler whose client left (only
``handler_cancellation=True`` does, which aiohttp's ``TestServer`` turns on). Enter the
lock through :func:`client_lock` to stop waiting when the client leaves, and optionally
to cancel the body of a holder whose client left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

from aiolock._errors import LockBackendError, LockLostError, LockTimeoutError, ManagerNotOpenError
from aiolock._manager import LockManager
from aiolock.contrib._disconnect import CLIENT_LEFT_STATUS, ClientWatch
from aiolock.contrib._shutdown import RETRY_AFTER
from aiolock.contrib._source import (
    ManagerSource,
    check_source,
    check_statuses,
    make_manager,
    missing,
)

try:
    from aiohttp import web
    from aiohttp.typedefs import Handler, Middleware
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing("aiohttp", exc) from exc

__all__ = ["LOCK_MANAGER", "ClientLeft", "client_lock", "lock_error_middleware", "lock_manager_ctx"]

logger = logging.getLogger("aiolock")
T = TypeVar("T")

#: How often :func:`client_lock` looks at the connection (aiohttp has no awaitable for
#: a peer that left once the request's body was read).
POLL_INTERVAL = 0.05

#: Where :func:`lock_manager_ctx` puts the app's manager: ``request.app[LOCK_MANAGER]``.
LOCK_MANAGER: web.AppKey[LockManager] = web.AppKey("aiolock.manager", LockManager)


def lock_manager_ctx(
    source: ManagerSource,
    *,
    key: web.AppKey[LockManager] = LOCK_MANAGER,
    **options: Any,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` that opens a manager at startup, as ``app[key]``, and closes it.

    At a graceful shutdown, the app's ``on_shutdown`` stops the manager from handing out
    locks (:meth:`~aiolock.LockManager.stop_acquiring`): waiting handlers and new
    acquisitions fail with :class:`~aiolock.ManagerNotOpenError` (503 from
    :func:`lock_error_middleware`), while holders may finish within aiohttp's
    ``shutdown_timeout``; handlers still running then are cancelled by aiohttp (their
    clients see the connection close) and the manager closes, releasing every lock.

    *source* is a Redis URL (the manager is ``LockManager.from_url(url, **options)``,
    with a client of its own, closed with it), a function returning a new manager, or a
    manager (which opens once). ``app.cleanup_ctx.append(lock_manager_ctx(url))``.
    """

    check_source(source, options)

    async def manager_ctx(app: web.Application) -> AsyncIterator[None]:
        manager = make_manager(source, dict(options))
        await manager.open()
        app[key] = manager

        async def stop_acquiring(app: web.Application) -> None:
            manager.stop_acquiring()

        # aiohttp runs on_shutdown before it cancels the handlers still running (after
        # shutdown_timeout) and the cleanup contexts after: waiting handlers give up with
        # a 503 there, instead of a dropped connection when they are cancelled.
        app.on_shutdown.append(stop_acquiring)
        try:
            yield
        finally:
            await manager.aclose()

    return manager_ctx


def lock_error_middleware(
    *,
    timeout_status: int = 423,
    lost_status: int = 409,
    unavailable_status: int = 503,
) -> Middleware:
    """A middleware turning aiolock's errors from handlers into JSON error responses.

    :class:`~aiolock.LockTimeoutError` -> *timeout_status* (423), :class:`LockLostError`
    -> *lost_status* (409), :class:`LockBackendError` and a closed manager ->
    *unavailable_status* (503). Other errors pass through.
    """
    check_statuses(timeout_status, lost_status, unavailable_status)

    @web.middleware
    async def lock_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except LockTimeoutError as exc:
            return _error(timeout_status, f"busy: {exc}; try again later")
        except LockLostError as exc:
            logger.warning("%s %s: %s", request.method, request.path, exc)
            return _error(
                lost_status,
                "a lock was lost while the request ran; its effects may have overlapped "
                "another request's: check, then retry",
            )
        except (LockBackendError, ManagerNotOpenError):
            unavailable = _error(
                unavailable_status, "the lock service is unavailable; try again later"
            )
            unavailable.headers["Retry-After"] = RETRY_AFTER
            return unavailable

    return lock_errors


def _error(status: int, detail: str) -> web.Response:
    return web.json_response({"detail": detail}, status=status)


class ClientLeft(web.HTTPClientError):
    """The client disconnected while the request waited for a lock (or held one, with
    ``cancel_on_disconnect``): status 499, which nobody reads."""

    status_code = CLIENT_LEFT_STATUS


@asynccontextmanager
async def client_lock(
    request: web.BaseRequest,
    handle: AbstractAsyncContextManager[T],
    *,
    cancel_on_disconnect: bool = False,
) -> AsyncIterator[T]:
    """``async with handle`` that gives up when the request's client disconnects.

    ``async with client_lock(request, locks.lock(name, timeout=5)) as lock:``. While the
    lock is awaited, the connection is looked at every :data:`POLL_INTERVAL` seconds;
    if the client left, the wait stops and :class:`ClientLeft` (499) is raised, so the
    request never takes the lock later to run its body for nobody. With
    *cancel_on_disconnect* the body is watched too: it is cancelled, the lock released
    and :class:`ClientLeft` raised if the client leaves while it runs. Needed under
    ``web.run_app``, whose default ``handler_cancellation=False`` cancels nothing.
    """
    watch = ClientWatch(lambda: _gone(request))
    try:
        entered = await handle.__aenter__()
    except BaseException as exc:
        watch.stop()
        if await watch.settle(exc):
            raise ClientLeft(reason="the client disconnected while the request waited") from None
        raise
    if not cancel_on_disconnect:
        watch.stop()
        if await watch.settle(None):  # it left just as the lock was granted
            await handle.__aexit__(None, None, None)
            raise ClientLeft(reason="the client disconnected while the request waited")
    try:
        yield entered
    except BaseException as exc:
        watch.stop()
        left = await watch.settle(exc)
        await handle.__aexit__(type(exc), exc, exc.__traceback__)
        if left:
            raise ClientLeft(reason="the client disconnected while the request ran") from None
        raise
    watch.stop()
    await watch.settle(None)  # left at the very end: the body finished anyway
    await handle.__aexit__(None, None, None)


async def _gone(request: web.BaseRequest) -> None:
    """Return once the request's connection is closed or closing."""
    while True:
        transport = request.transport
        if transport is None or transport.is_closing():
            return
        await asyncio.sleep(POLL_INTERVAL)
