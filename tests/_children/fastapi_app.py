"""The app the uvicorn test serves: ``uvicorn tests._children.fastapi_app:app``.

Reads ``REDIS_URL`` and ``AIOLOCK_PREFIX``. ``POST /orders/{order_id}/pay`` holds lock
``order:{order_id}`` and, inside it, counts itself in and out of a Redis counter shared by
every process: ``inside`` in the response is how many requests were in the section with
it, itself included (1 unless two overlapped).

``POST /slow/{name}?seconds=S`` holds lock ``slow:{name}`` (waiting as long as it takes)
for S seconds (``&until_stop=true``: until the manager stops acquiring, then 0.2 s, at
most S); ``GET /slow`` says how many such requests have arrived (the shutdown tests
send the signal once every request is in).
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Any

from fastapi import Depends, FastAPI

import aiolock
from aiolock.contrib.fastapi import get_lock_manager, lock_dependency, lock_lifespan

PREFIX = os.environ["AIOLOCK_PREFIX"]
app = FastAPI(lifespan=lock_lifespan(os.environ["REDIS_URL"], prefix=PREFIX, lease=10))
Held = Annotated[
    aiolock.Lock, Depends(lock_dependency("order:{order_id}", timeout=20), scope="function")
]


@app.get("/health")
async def health(locks: Annotated[aiolock.LockManager, Depends(get_lock_manager)]) -> float:
    return await locks.ping()


@app.post("/orders/{order_id}/pay")
async def pay(
    order_id: str,
    lock: Held,
    locks: Annotated[aiolock.LockManager, Depends(get_lock_manager)],
) -> dict[str, Any]:
    counter = f"{PREFIX}:probe:{order_id}"
    inside = await locks.redis.incr(counter)
    await asyncio.sleep(0.02)  # the critical section
    await locks.redis.decr(counter)
    return {"inside": inside, "token": lock.fencing_token, "pid": os.getpid()}


Waited = Annotated[
    aiolock.Lock, Depends(lock_dependency("slow:{name}", timeout=None), scope="function")
]
#: POST /slow/... requests that have arrived (a middleware counts them before they wait)
arrived = {"slow": 0}


@app.middleware("http")
async def count_slow(request: Any, call_next: Any) -> Any:
    if request.method == "POST" and request.url.path.startswith("/slow/"):
        arrived["slow"] += 1
    return await call_next(request)


@app.get("/slow")
async def slow_arrived() -> int:
    return arrived["slow"]


@app.post("/slow/{name}")
async def slow(
    name: str,
    lock: Waited,
    locks: Annotated[aiolock.LockManager, Depends(get_lock_manager)],
    seconds: float = 1.0,
    until_stop: bool = False,
) -> dict[str, Any]:
    """Hold for *seconds*; with *until_stop*, until the manager stops acquiring (the
    shutdown's first step), then 0.2 s more, at most *seconds*: the holder of the
    shutdown tests releases after the stop, whatever a loaded machine does to timing."""
    deadline = asyncio.get_running_loop().time() + seconds
    while until_stop and locks.is_acquiring and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)  # (polled: the stop is the manager's, not an event here)
    await asyncio.sleep(0.2 if until_stop else seconds)
    return {"name": name, "token": lock.fencing_token}
