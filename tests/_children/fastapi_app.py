"""The app the uvicorn test serves: ``uvicorn tests._children.fastapi_app:app``.

Reads ``REDIS_URL`` and ``AIOLOCK_PREFIX``. ``POST /orders/{order_id}/pay`` holds lock
``order:{order_id}`` and, inside it, counts itself in and out of a Redis counter shared by
every process: ``inside`` in the response is how many requests were in the section with
it, itself included (1 unless two overlapped).
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
