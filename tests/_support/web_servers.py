"""Real web servers in the test's own process, on free loopback ports, and a raw HTTP
client that can leave mid-request (issue 23: what each server does on disconnect)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from aiohttp import web


@asynccontextmanager
async def uvicorn_serving(app: Any) -> AsyncIterator[str]:
    """Serve the ASGI *app* with uvicorn (lifespan on); yield its base URL."""
    # Port 0: the kernel picks a free port as the socket binds it (a port picked free
    # beforehand may be taken meanwhile by a suite running beside this one).
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert not task.done(), "uvicorn did not start"
            assert time.monotonic() < deadline, "uvicorn did not start within 20 s"
            await asyncio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


@asynccontextmanager
async def aiohttp_serving(app: web.Application) -> AsyncIterator[str]:
    """Serve *app* as ``web.run_app`` does (``handler_cancellation`` off); yield its URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)  # port 0: bound free, no race
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def leaving_client(base: str, path: str) -> AsyncIterator[None]:
    """Send ``GET path`` on a connection of its own; leaving the block closes it (the
    client disconnects before any response)."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    await writer.drain()
    try:
        yield
    finally:
        writer.close()
        await writer.wait_closed()
        del reader


async def until(predicate: Any, what: str, within: float = 10.0) -> None:
    """Wait (bounded) until ``predicate()`` is true."""
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        await asyncio.sleep(0.01)
