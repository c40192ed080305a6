"""A rolling deploy without 500s (issue 37, item 2): at the server's SIGTERM, requests
waiting for a lock get a 503 with ``Retry-After`` at once, the holder finishes within the
grace time, and the log has no traceback.

Each test runs a real server process (uvicorn; gunicorn with uvicorn workers; hypercorn
with and without worker processes) on the FastAPI app of ``tests/_children/fastapi_app.py``
and sends it the real signal, by pid.
Before the hook, uvicorn answered the waiters 500 when its grace time ran out (and logged
a traceback per request), and gunicorn's master killed the worker with them still
waiting (no response at all).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import httpx
import pytest

from aiolock.contrib._shutdown import SIGNALS, StopOnSignals
from tests._support.paths import REPO_ROOT

pytest.importorskip("fastapi")

APP = "tests._children.fastapi_app:app"
#: how long each request holds the lock: the holder's ends well inside the servers'
#: grace time (GRACE), and the waiters would still wait when it ends (before the hook,
#: uvicorn answered them 500; gunicorn killed the worker with them waiting)
HOLD = 1.0
GRACE = 2


@contextmanager
def _serving(
    command: list[str], listening: str, redis_url: str, prefix: str
) -> Iterator[tuple[subprocess.Popen[bytes], str, IO[bytes]]]:
    """Start *command* (it binds port 0 and logs the port by *listening*, a pattern with
    one group); yield the process, its base URL and its log; stop it by pid at the end."""
    env = {**os.environ, "REDIS_URL": redis_url, "AIOLOCK_PREFIX": prefix}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 30
            while not (found := re.search(listening, _read(log))) or found[1] == "0":
                assert server.poll() is None, f"the server exited early:\n{_read(log)}"
                assert time.monotonic() < deadline, f"no port logged in 30 s:\n{_read(log)}"
                time.sleep(0.05)
            yield server, f"http://127.0.0.1:{found[1]}", log
        finally:
            if server.poll() is None:
                server.kill()
            server.wait(timeout=30)


def _read(log: IO[bytes]) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")


async def _deploy(server: subprocess.Popen[bytes], base: str) -> list[httpx.Response]:
    """One holder and three waiters on one lock; SIGTERM once all four are in."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        deadline = time.monotonic() + 20
        while True:  # up: the lifespan opened the manager
            try:
                if (await client.get("/health")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not answer within 20 s"
            await asyncio.sleep(0.05)
        # The holder holds until the server's stop reached the manager (then 0.2 s): the
        # waiters are still waiting then, however slow a loaded machine made their arrival.
        holder = asyncio.create_task(
            client.post("/slow/deploy", params={"seconds": GRACE, "until_stop": True})
        )
        await _until(client, 1)  # the holder first, so that it is the one holding
        await asyncio.sleep(0.2)
        waiters = [
            asyncio.create_task(client.post("/slow/deploy", params={"seconds": HOLD}))
            for _ in range(3)
        ]
        await _until(client, 4)
        server.send_signal(signal.SIGTERM)
        return await asyncio.gather(holder, *waiters)


async def _until(client: httpx.AsyncClient, arrived: int) -> None:
    deadline = time.monotonic() + 10
    while (await client.get("/slow")).json() < arrived:
        assert time.monotonic() < deadline, f"{arrived} requests did not arrive in 10 s"
        await asyncio.sleep(0.02)


def _check(responses: list[httpx.Response], server: subprocess.Popen[bytes], log: str) -> None:
    statuses = [response.status_code for response in responses]
    assert statuses == [200, 503, 503, 503], f"{statuses}\n{log}"
    for waiter in responses[1:]:
        assert waiter.headers["Retry-After"].isdigit()
        assert "unavailable" in waiter.json()["detail"]
    server.wait(timeout=GRACE + 20)
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log


@pytest.mark.processes
def test_uvicorn_answers_waiting_requests_503_at_sigterm(redis_url: str, prefix: str) -> None:
    command = [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", "0",
               "--timeout-graceful-shutdown", str(GRACE)]  # fmt: skip
    with _serving(command, r"Uvicorn running on http://127\.0\.0\.1:(\d+)", redis_url, prefix) as (
        server,
        base,
        log,
    ):
        started = time.monotonic()
        responses = asyncio.run(_deploy(server, base))
        server.wait(timeout=GRACE + 20)
        assert time.monotonic() - started < GRACE + 10
        _check(responses, server, _read(log))
        assert "Application shutdown complete" in _read(log)


@pytest.mark.processes
def test_gunicorn_with_uvicorn_workers_answers_waiting_requests_503_at_sigterm(
    redis_url: str, prefix: str
) -> None:
    pytest.importorskip("gunicorn")
    command = [sys.executable, "-m", "gunicorn", APP, "-k", "uvicorn.workers.UvicornWorker",
               "-w", "1", "-b", "127.0.0.1:0", "--graceful-timeout", str(GRACE)]  # fmt: skip
    with _serving(command, r"Listening at: http://127\.0\.0\.1:(\d+)", redis_url, prefix) as (
        server,
        base,
        log,
    ):
        responses = asyncio.run(_deploy(server, base))  # SIGTERM to the master, by pid
        server.wait(timeout=GRACE + 20)
        _check(responses, server, _read(log))
        assert "Shutting down: Master" in _read(log)


@pytest.mark.processes
@pytest.mark.parametrize("workers", ["0", "1"])
def test_hypercorn_answers_waiting_requests_503_at_sigterm(
    redis_url: str, prefix: str, workers: str
) -> None:
    """``--workers 0``: the process that gets the signal serves, and hypercorn's handlers
    are asyncio's (``loop.add_signal_handler``), which the hook chains to. ``--workers 1``
    (hypercorn's default): the signal goes to the parent, which tells the worker process
    through a multiprocessing event that the hook polls."""
    pytest.importorskip("hypercorn")
    command = [sys.executable, "-m", "hypercorn", APP, "--bind", "127.0.0.1:0",
               "--graceful-timeout", str(GRACE), "--workers", workers]  # fmt: skip
    with _serving(command, r"Running on http://127\.0\.0\.1:(\d+)", redis_url, prefix) as (
        server,
        base,
        log,
    ):
        responses = asyncio.run(_deploy(server, base))  # SIGTERM to the parent, by pid
        server.wait(timeout=GRACE + 20)
        _check(responses, server, _read(log))


async def test_the_hook_chains_to_the_handler_it_found_and_puts_it_back() -> None:
    calls: list[str] = []
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}

    def servers_own(signum: int, frame: object) -> None:
        calls.append(f"server {signum}")

    signal.signal(signal.SIGTERM, servers_own)
    try:
        hook = StopOnSignals(lambda: calls.append("stop"))
        assert hook.install()
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.05)  # the stop is scheduled in the loop
        assert calls == [f"server {signal.SIGTERM}", "stop"]
        hook.remove()
        assert signal.getsignal(signal.SIGTERM) is servers_own
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


async def test_no_hook_where_the_signal_would_end_the_process_anyway() -> None:
    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        hook = StopOnSignals(lambda: None)
        hook.install()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        hook.remove()
    finally:
        signal.signal(signal.SIGTERM, before)


async def test_no_hook_outside_the_main_thread() -> None:
    def install() -> bool:
        async def inner() -> bool:
            return StopOnSignals(lambda: None).install()

        return asyncio.run(inner())

    assert await asyncio.to_thread(install) is False
