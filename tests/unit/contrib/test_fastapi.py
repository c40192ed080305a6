"""aiolock.contrib.fastapi against a real redis-server: the app is driven with httpx's
ASGITransport (one process), and once through a real uvicorn process."""

# No "from __future__ import annotations": FastAPI reads the endpoints' annotations,
# which name local dependencies, at run time.

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import IO, Annotated, Any

import httpx
import pytest
import redis
from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from redis.asyncio import Redis

import aiolock
from aiolock.contrib.fastapi import (
    check_lock_scopes,
    get_lock_manager,
    lock_dependency,
    lock_lifespan,
    locked_streaming_response,
)
from aiolock.testing import RedisServer
from tests._support.helpers import closed_port, lock_held
from tests._support.paths import REPO_ROOT
from tests._support.web_servers import uvicorn_serving


@asynccontextmanager
async def serve(app: FastAPI, **transport: Any) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan, and a client talking to the app in this process."""
    async with app.router.lifespan_context(app):
        asgi = httpx.ASGITransport(app, **transport)
        async with httpx.AsyncClient(transport=asgi, base_url="http://app") as client:
            yield client


def order_app(
    redis_url: str, prefix: str, *, check_on_open: bool = True, **options: Any
) -> FastAPI:
    """An app whose GET /orders/{order_id} holds lock order:{order_id}."""
    lease = options.pop("lease", 30)
    lifespan = lock_lifespan(redis_url, prefix=prefix, lease=lease, check_on_open=check_on_open)
    app = FastAPI(lifespan=lifespan)
    held = Depends(lock_dependency("order:{order_id}", **options), scope="function")
    Held = Annotated[aiolock.Lock, held]

    @app.get("/orders/{order_id}")
    async def get_order(order_id: int, lock: Held) -> dict[str, Any]:
        return {"token": lock.fencing_token, "owned": await lock.owned(), "name": lock.name}

    return app


async def test_the_lock_is_held_during_the_endpoint_and_released_before_the_response(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    app = order_app(redis_url, prefix)
    seen: list[bool] = []

    @app.get("/probe/{order_id}")
    async def probe(
        order_id: str,
        lock: Annotated[
            aiolock.Lock, Depends(lock_dependency("order:{order_id}"), scope="function")
        ],
    ) -> None:
        seen.append(await locks.lock(f"order:{order_id}").locked())

    async with serve(app) as client:
        response = await client.get("/orders/42")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["owned"] is True and body["name"] == "order:42"
        assert isinstance(body["token"], int)
        assert not await locks.lock("order:42").locked()  # released before we got the response
        assert (await client.get("/probe/7")).status_code == 200
        assert seen == [True]
        manager = app.state.aiolock
        assert manager.is_open
    assert not manager.is_open  # the lifespan closed it
    assert not hasattr(app.state, "aiolock")


async def test_a_busy_lock_gives_423_or_the_configured_status(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    async with serve(order_app(redis_url, prefix, timeout=0.1)) as client:
        async with locks.lock("order:5"):
            response = await client.get("/orders/5")
            assert response.status_code == 423
            assert "order:5" in response.json()["detail"]
            assert (await client.get("/orders/6")).status_code == 200  # another order
        assert (await client.get("/orders/5")).status_code == 200
    app = order_app(redis_url, prefix, timeout=0, timeout_status=409)
    async with serve(app) as client, locks.lock("order:5"):
        assert (await client.get("/orders/5")).status_code == 409


async def test_requests_for_one_order_take_turns(redis_url: str, prefix: str) -> None:
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix))
    inside: dict[str, int] = {}
    most: dict[str, int] = {}

    @app.post("/orders/{order_id}/pay")
    async def pay(
        order_id: str,
        _: Annotated[aiolock.Lock, Depends(lock_dependency("order:{order_id}"), scope="function")],
    ) -> None:
        inside[order_id] = inside.get(order_id, 0) + 1
        most[order_id] = max(most.get(order_id, 0), inside[order_id])
        await asyncio.sleep(0.01)
        inside[order_id] -= 1

    async with serve(app) as client:
        responses = await asyncio.gather(*(client.post(f"/orders/{i % 2}/pay") for i in range(16)))
    assert [r.status_code for r in responses] == [200] * 16
    assert most == {"0": 1, "1": 1}


async def test_a_lock_lost_before_the_endpoint_returns_gives_409(
    redis_url: str, prefix: str, admin: Redis
) -> None:
    """Force-released by an administrator while the endpoint runs: found at release."""
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix))

    @app.post("/orders/{order_id}/pay")
    async def pay(
        order_id: str,
        lock: Annotated[
            aiolock.Lock, Depends(lock_dependency("order:{order_id}"), scope="function")
        ],
    ) -> dict[str, str]:
        async with aiolock.LockManager(admin, prefix=prefix) as other:
            assert await other.lock(lock.name).force_release()
        return {"paid": order_id}

    async with serve(app) as client:
        response = await client.post("/orders/9/pay")
    assert response.status_code == 409, response.text
    assert "was lost" in response.json()["detail"]


async def test_a_lock_lost_before_the_endpoint_begins_gives_409_and_never_runs_it(
    redis_url: str, prefix: str, admin: Redis
) -> None:
    """The grant's reply comes after the lease ran out (the server is paused): the
    endpoint used to run, holding nothing."""
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix, lease=0.3))
    ran: list[str] = []

    @app.post("/orders/{order_id}/pay")
    async def pay(
        order_id: str,
        lock: Annotated[
            aiolock.Lock, Depends(lock_dependency("order:{order_id}"), scope="function")
        ],
    ) -> dict[str, str]:
        ran.append(order_id)
        return {"paid": order_id}

    async with serve(app) as client:
        await admin.client_pause(1200, all=True)
        response = await client.post("/orders/8/pay")
    assert response.status_code == 409, response.text
    assert "before the request ran" in response.json()["detail"]
    assert ran == []


async def test_a_sync_endpoint_whose_lock_is_lost_gives_409(redis_url: str, prefix: str) -> None:
    """A def endpoint runs in a worker thread; the loss is found at release, still a 409."""
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix))
    store = redis.Redis.from_url(redis_url)

    @app.post("/orders/{order_id}/pay")
    def pay(
        order_id: str,
        lock: Annotated[
            aiolock.Lock, Depends(lock_dependency("order:{order_id}"), scope="function")
        ],
    ) -> None:
        assert store.delete(lock.key) == 1  # the hold vanishes behind the lock's back

    try:
        async with serve(app) as client:
            assert (await client.post("/orders/4/pay")).status_code == 409
    finally:
        store.close()


async def test_a_lock_lost_while_the_endpoint_waits_cancels_it_and_gives_409(
    redis_url: str, prefix: str, admin: Redis
) -> None:
    """The loss is noticed by renewal (lease 1.5 s: every 0.5 s) and cancels the endpoint."""
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix, lease=1.5))
    finished: list[str] = []

    @app.post("/orders/{order_id}/pay")
    async def pay(
        order_id: str,
        lock: Annotated[
            aiolock.Lock, Depends(lock_dependency("order:{order_id}"), scope="function")
        ],
    ) -> None:
        async with aiolock.LockManager(admin, prefix=prefix) as other:
            await other.lock(lock.name).force_release()
        await asyncio.sleep(30)
        finished.append(order_id)

    async with serve(app) as client:
        started = time.monotonic()
        response = await client.post("/orders/3/pay")
        elapsed = time.monotonic() - started
    assert response.status_code == 409, response.text
    # 15 s: room for a loaded machine, far below the endpoint's 30 s
    assert elapsed < 15, f"the loss cancelled the endpoint after {elapsed:.1f} s"
    assert finished == []


async def test_redis_unreachable_or_manager_closed_gives_503(redis_url: str, prefix: str) -> None:
    with closed_port() as port:
        dead = f"redis://127.0.0.1:{port}/0"
        # (an app that starts before Redis: open() does not check the server)
        app = order_app(dead, prefix, check_on_open=False, timeout=0.3)
        async with serve(app) as client:
            response = await client.get("/orders/1")
            assert response.status_code == 503, response.text
            assert response.headers["Retry-After"].isdigit()  # a client may come back
    app = order_app(redis_url, prefix)
    async with serve(app) as client:
        manager = app.state.aiolock
        await manager.aclose()
        assert (await client.get("/orders/1")).status_code == 503


async def test_the_lifespan_refuses_a_dead_redis_at_startup(prefix: str) -> None:
    """Issue 18 item 7: lock_lifespan opened a manager on a dead port without a word."""
    with closed_port() as port:
        dead = f"redis://127.0.0.1:{port}/0"
        with pytest.raises(aiolock.LockConnectionError, match="could not open"):
            async with serve(order_app(dead, prefix)):
                pass


async def test_every_request_waiting_during_an_outage_gives_503(prefix: str) -> None:
    """Issue 18 item 6: of 10 requests waiting on one free lock while Redis is down, all
    get 503 (8-9 got 423 "busy": only the head of the manager's queue talked to Redis)."""
    with RedisServer() as server:
        app = order_app(server.url, prefix, timeout=2)
        async with serve(app) as client:
            assert (await client.get("/orders/1")).status_code == 200
            server.stop()
            responses = await asyncio.wait_for(
                asyncio.gather(*(client.get("/orders/1") for _ in range(10))), 30
            )
    assert [r.status_code for r in responses] == [503] * 10, [r.text for r in responses]


async def test_the_default_dependency_scope_is_refused(redis_url: str, prefix: str) -> None:
    """In the default scope the release would come after the response: refused, loudly."""
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix))

    @app.get("/orders/{order_id}")
    async def get_order(
        order_id: str, _: Annotated[aiolock.Lock, Depends(lock_dependency("order:{order_id}"))]
    ) -> None:
        raise AssertionError("must not run")

    with pytest.raises(RuntimeError, match="scope='function'"):
        check_lock_scopes(app)
    with pytest.raises(RuntimeError, match="scope='function'"):
        async with app.router.lifespan_context(app):
            pass
    # Without the lifespan's check (a manager set by hand), the first request is refused.
    async with aiolock.LockManager.from_url(redis_url, prefix=prefix) as manager:
        app.state.aiolock = manager
        asgi = httpx.ASGITransport(app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=asgi, base_url="http://app") as client:
            assert (await client.get("/orders/1")).status_code == 500
            assert (await client.get("/orders/1")).status_code == 500  # every time
        assert manager.statistics().acquired == {}


async def test_names_from_path_and_query_parameters_with_types(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix))
    report = lock_dependency("report:{region}:{day}", types={"day": int})

    @app.get("/reports/{region}")
    async def get_report(
        region: str, day: int, lock: Annotated[aiolock.Lock, Depends(report, scope="function")]
    ) -> str:
        return lock.name

    async with serve(app) as client:
        assert (await client.get("/reports/eu", params={"day": "007"})).json() == "report:eu:7"
        missing = await client.get("/reports/eu")
        assert missing.status_code == 422
        assert (await client.get("/reports/eu", params={"day": "x"})).status_code == 422
        too_long = await client.get(f"/reports/{'x' * 5000}", params={"day": 1})
        assert too_long.status_code == 422
        assert "not a valid lock name" in too_long.text
        stats = app.state.aiolock.statistics()
        assert stats.acquired == {"lock": 1}  # invalid requests took no lock
        assert stats.held == 0


async def test_read_locks_share_write_locks_exclude(redis_url: str, prefix: str) -> None:
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix))
    inside = {"n": 0, "most": 0}

    async def visit() -> None:
        inside["n"] += 1
        inside["most"] = max(inside["most"], inside["n"])
        await asyncio.sleep(0.05)
        inside["n"] -= 1

    @app.get("/docs/{doc_id}")
    async def read(
        doc_id: str,
        lock: Annotated[
            Any, Depends(lock_dependency("doc:{doc_id}", kind="read"), scope="function")
        ],
    ) -> None:
        await visit()

    @app.put("/docs/{doc_id}")
    async def write(
        doc_id: str,
        lock: Annotated[
            Any, Depends(lock_dependency("doc:{doc_id}", kind="write"), scope="function")
        ],
    ) -> None:
        await visit()

    async with serve(app) as client:
        responses = await asyncio.gather(*(client.get("/docs/1") for _ in range(4)))
        assert [r.status_code for r in responses] == [200] * 4
        assert inside["most"] > 1  # readers shared the lock
        inside["most"] = 0
        responses = await asyncio.gather(*(client.put("/docs/1") for _ in range(4)))
        assert [r.status_code for r in responses] == [200] * 4
        assert inside["most"] == 1


async def test_get_lock_manager_and_a_missing_manager(redis_url: str, prefix: str) -> None:
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix))

    @app.get("/health")
    async def health(locks: Annotated[aiolock.LockManager, Depends(get_lock_manager)]) -> float:
        return await locks.ping()

    async with serve(app) as client:
        assert (await client.get("/health")).status_code == 200
    bare = FastAPI()
    bare.get("/health")(health)
    asgi = httpx.ASGITransport(bare, raise_app_exceptions=True)
    async with httpx.AsyncClient(transport=asgi, base_url="http://app") as client:
        with pytest.raises(RuntimeError, match="lock_lifespan"):
            await client.get("/health")


async def test_a_lifespan_of_ones_own_and_a_manager_factory(redis_url: str, prefix: str) -> None:
    made: list[aiolock.LockManager] = []

    def factory() -> aiolock.LockManager:
        made.append(aiolock.LockManager.from_url(redis_url, prefix=prefix))
        return made[-1]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with lock_lifespan(factory)(app) as state:
            yield {**state, "other": 1}

    app = FastAPI(lifespan=lifespan)
    for _ in range(2):  # a factory makes a new manager at each startup
        async with app.router.lifespan_context(app) as state:
            assert state is not None
            assert state["aiolock"] is made[-1] and made[-1].is_open
    assert len(made) == 2 and not made[1].is_open


def test_arguments_are_checked_when_the_dependency_is_made() -> None:
    with pytest.raises(ValueError, match="kind"):
        lock_dependency("a:{x}", kind="semaphore")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="multi-lock"):
        lock_dependency(["a:{x}", "b:{y}"], kind="read")
    with pytest.raises(ValueError, match="400-599"):
        lock_dependency("a:{x}", timeout_status=200)
    with pytest.raises(ValueError, match="'y'"):
        lock_dependency("a:{x}", types={"y": int})
    with pytest.raises(ValueError, match="path or query parameter"):
        lock_dependency("a:{order.id}")
    with pytest.raises(ValueError, match="timeout"):
        lock_dependency("a:{x}", timeout=-1)
    with pytest.raises(TypeError, match="URL"):
        lock_lifespan(lambda: aiolock.LockManager.from_url("redis://127.0.0.1:1"), prefix="p")


# -- a real server ------------------------------------------------------------------------


@pytest.mark.processes
def test_uvicorn_processes_never_overlap_requests_for_one_order(
    redis_url: str, prefix: str
) -> None:
    """Two uvicorn processes, 24 concurrent requests for one order: one at a time."""
    env = {**os.environ, "REDIS_URL": redis_url, "AIOLOCK_PREFIX": prefix}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    # Each child binds port 0 and logs the port it got: a port chosen here could be taken
    # by another suite's server before the child binds it (issue 25).
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "tests._children.fastapi_app:app",
        "--host",
        "127.0.0.1",
    ]
    with tempfile.TemporaryFile() as first, tempfile.TemporaryFile() as second:
        logs = [first, second]
        servers = [
            subprocess.Popen(
                [*command, "--port", "0", "--no-access-log"],
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            for log in logs
        ]
        try:
            ports = [_uvicorn_port(server, log) for server, log in zip(servers, logs, strict=True)]
            asyncio.run(_hammer([f"http://127.0.0.1:{port}" for port in ports], servers))
        finally:
            for server in servers:
                server.terminate()  # by pid: SIGTERM, uvicorn shuts down and closes the manager
            for server in servers:
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait(timeout=10)
        for server, log in zip(servers, logs, strict=True):
            stderr = _read_log(log)
            # uvicorn shuts down gracefully (the lifespan closes the manager), then re-raises
            # the signal it caught.
            assert server.returncode in (0, -signal.SIGTERM), stderr
            assert "Application shutdown complete" in stderr, stderr
            assert "Traceback" not in stderr, stderr


def _read_log(log: IO[bytes]) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")


def _uvicorn_port(server: subprocess.Popen[bytes], log: IO[bytes], timeout: float = 30) -> int:
    """The port a uvicorn child started with ``--port 0`` listens on, read from its log."""
    deadline = time.monotonic() + timeout
    while True:
        found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", _read_log(log))
        if found and int(found[1]) != 0:
            return int(found[1])
        assert found is None, f"uvicorn did not log the port it got: {_read_log(log)}"
        assert server.poll() is None, f"uvicorn exited early: {_read_log(log)}"
        assert time.monotonic() < deadline, (
            f"uvicorn did not log its port within {timeout} s: {_read_log(log)}"
        )
        time.sleep(0.05)


async def _hammer(bases: list[str], servers: list[subprocess.Popen[bytes]]) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        deadline = time.monotonic() + 20
        for base, server in zip(bases, servers, strict=True):
            while True:
                assert server.poll() is None, "uvicorn exited early"
                assert time.monotonic() < deadline, "uvicorn did not start within 20 s"
                try:
                    if (await client.get(f"{base}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        responses = await asyncio.gather(
            *(client.post(f"{bases[i % 2]}/orders/77/pay") for i in range(24))
        )
    assert [r.status_code for r in responses] == [200] * 24, [r.text for r in responses]
    inside = [r.json()["inside"] for r in responses]
    assert inside == [1] * 24  # each request was alone in the critical section
    tokens = sorted(r.json()["token"] for r in responses)
    assert len(set(tokens)) == 24
    assert {r.json()["pid"] for r in responses} == {s.pid for s in servers}


@pytest.mark.processes
def test_the_example_app_checks_itself(redis_url: str) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "fastapi_app.py"), "--check"],
        env={**os.environ, "REDIS_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "statuses: [200, 200, 200, 200, 200]" in result.stdout
    assert "fencing tokens increase: True" in result.stdout


async def test_the_openapi_schema_lists_each_parameter_once(redis_url: str, prefix: str) -> None:
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix))
    held = lock_dependency("order:{order_id}", types={"order_id": int})

    @app.get("/orders/{order_id}")
    async def get_order(
        order_id: int, _: Annotated[aiolock.Lock, Depends(held, scope="function")]
    ) -> None:
        pass

    parameters = app.openapi()["paths"]["/orders/{order_id}"]["get"]["parameters"]
    assert [(p["name"], p["in"]) for p in parameters] == [("order_id", "path")]


async def test_a_field_the_route_does_not_declare_is_refused_at_startup(
    redis_url: str, prefix: str
) -> None:
    # A typo ({oder_id}) used to become a required query parameter of its own: startup
    # went fine and every request got a 422.
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix))

    @app.post("/orders/{order_id}/pay")
    async def pay(
        order_id: int,
        lock: Annotated[Any, Depends(lock_dependency("order:{oder_id}"), scope="function")],
    ) -> None: ...

    with pytest.raises(RuntimeError, match=r"\{oder_id\}.*neither a path parameter"):
        async with app.router.lifespan_context(app):
            pass
    with pytest.raises(RuntimeError, match="oder_id"):
        check_lock_scopes(app)


async def test_query_fields_the_endpoint_declares_and_names_that_format_alike(
    redis_url: str, prefix: str, locks: aiolock.LockManager
) -> None:
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix))
    accounts = lock_dependency(["acct:{src}", "acct:{dst}"])

    @app.post("/transfers/{src}")
    async def transfer(
        src: str, dst: str, lock: Annotated[Any, Depends(accounts, scope="function")]
    ) -> list[str]:
        return sorted(lock.names)

    async with serve(app) as client:
        same = await client.post("/transfers/a", params={"dst": "a"})
        assert same.status_code == 200, same.text
        assert same.json() == ["acct:a"]
        assert (await client.post("/transfers/a", params={"dst": "b"})).json() == [
            "acct:a",
            "acct:b",
        ]


def test_a_field_nested_in_a_format_spec_is_refused() -> None:
    with pytest.raises(ValueError, match="nests a field"):
        lock_dependency("a:{x:{y}}")


# --------------------------------------------------------------------------------------
# Locks and streaming responses under a real uvicorn in this process (issue 23, item 2).

CHUNK = b"x" * 65536  # large: the body soon waits for the client to read (back-pressure)


def streaming_app(redis_url: str, prefix: str, entered: asyncio.Event) -> FastAPI:
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix, lease=30))

    @app.middleware("http")
    async def passthrough(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        return await call_next(request)

    @app.get("/export")
    async def export(request: Request) -> StreamingResponse:
        locks = get_lock_manager(request)

        async def body() -> AsyncIterator[bytes]:
            async with locks.lock("export"):
                entered.set()
                for _ in range(10_000):
                    yield CHUNK

        return StreamingResponse(body())

    return app


async def read_one_chunk_and_leave(url: str) -> None:
    async with httpx.AsyncClient() as client, client.stream("GET", url) as response:
        assert response.status_code == 200
        async for _ in response.aiter_bytes():
            break  # and the connection closes mid-stream


async def test_a_client_leaving_a_locked_stream_behind_a_middleware_frees_the_lock_cleanly(
    redis_url: str, prefix: str, admin: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    entered = asyncio.Event()
    app = streaming_app(redis_url, prefix, entered)
    key = f"{prefix}:lock:{{export}}"
    with caplog.at_level(logging.WARNING):
        async with uvicorn_serving(app) as base:
            for _ in range(3):
                entered.clear()
                await read_one_chunk_and_leave(f"{base}/export")
                assert entered.is_set()
                started = time.monotonic()
                while await lock_held(admin, key):  # freed while the server runs (lease 30 s)
                    assert time.monotonic() - started < 10, "the lock stayed held"
                    await asyncio.sleep(0.01)
    logged = "\n".join(
        record.getMessage() + (repr(record.exc_info[1]) if record.exc_info else "")
        for record in caplog.records
    )
    assert "cancel scope" not in logged
    assert "Exception in ASGI application" not in logged
    assert "did not enter it" not in logged
    assert "task of its own" not in logged  # the warning names the open block instead


def helper_app(redis_url: str, prefix: str, sent: list[int]) -> FastAPI:
    """GET /export streams under lock 'export' through locked_streaming_response."""
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix=prefix, lease=30))

    @app.middleware("http")
    async def passthrough(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        return await call_next(request)

    @app.get("/export")
    async def export(request: Request, chunks: int = 10_000) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            for number in range(chunks):
                sent.append(number)
                yield CHUNK

        locks = get_lock_manager(request)
        return await locked_streaming_response(
            locks.lock("export", timeout=0.2), body(), media_type="application/octet-stream"
        )

    return app


async def test_locked_streaming_response_holds_the_lock_for_the_stream_and_frees_it_on_leaving(
    redis_url: str, prefix: str, admin: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    sent: list[int] = []
    app = helper_app(redis_url, prefix, sent)
    key = f"{prefix}:lock:{{export}}"
    with caplog.at_level(logging.WARNING):
        async with uvicorn_serving(app) as base, httpx.AsyncClient(base_url=base) as client:
            async with client.stream("GET", "/export") as streaming:
                assert streaming.status_code == 200
                chunks = streaming.aiter_bytes()  # kept: closing it would close the connection
                await chunks.__anext__()
                assert await admin.exists(key)  # held while the stream runs
                busy = await client.get("/export", params={"chunks": 1})
                assert busy.status_code == 423  # refused before anything was sent
                await streaming.aclose()  # the client leaves mid-stream
            started = time.monotonic()
            while await lock_held(admin, key):  # the client left: freed while the server runs
                assert time.monotonic() - started < 10, "the lock stayed held"
                await asyncio.sleep(0.01)
            whole = await client.get("/export", params={"chunks": 3})
            assert whole.status_code == 200 and len(whole.content) == 3 * len(CHUNK)
            assert not await lock_held(admin, key)
            manager: aiolock.LockManager = app.state.aiolock
            assert manager.statistics().released_on_task_exit == 0
    assert len(sent) < 10_000  # the stream stopped when its client left
    assert [r.getMessage() for r in caplog.records if r.name == "aiolock"] == []
