"""A FastAPI app whose payments hold a lock per order (needs: pip install 'aiolock[fastapi]').

Run:   python examples/fastapi_app.py [--port N]   serve on a free loopback port (or N)
       python examples/fastapi_app.py --check      run a few requests in-process, print, exit

Uses $REDIS_URL, or starts a throwaway redis-server. Try, while it serves:

    curl -X POST http://127.0.0.1:PORT/orders/42/pay     # 200, with a fencing token
    curl http://127.0.0.1:PORT/health                    # Redis round trip in seconds
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Annotated, Any

import httpx
import uvicorn
from fastapi import Depends, FastAPI

import aiolock
from aiolock.contrib.fastapi import get_lock_manager, lock_dependency, lock_lifespan
from aiolock.testing import free_port, redis_url_from_env

# scope="function": the lock is released (and a loss turned into a 409) before the
# response is sent. FastAPI's default scope would release it after the response.
OrderLock = Annotated[
    aiolock.Lock,
    Depends(
        lock_dependency("order:{order_id}", timeout=5, types={"order_id": int}), scope="function"
    ),
]
Locks = Annotated[aiolock.LockManager, Depends(get_lock_manager)]


def make_app(redis_url: str) -> FastAPI:
    app = FastAPI(lifespan=lock_lifespan(redis_url, prefix="example-shop"))

    @app.post("/orders/{order_id}/pay")
    async def pay(order_id: int, lock: OrderLock) -> dict[str, Any]:
        # One request per order at a time, across every process of the app. Pass the
        # fencing token to the storage you write to, so it can refuse stale writers.
        await asyncio.sleep(0.05)  # charge the card, write the order...
        return {"order": order_id, "paid": True, "fencing_token": lock.fencing_token}

    @app.get("/health")
    async def health(locks: Locks) -> dict[str, float]:
        return {"redis_round_trip": await locks.ping()}

    return app


async def check(app: FastAPI) -> None:
    """Five concurrent payments of one order, in this process: they take turns."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
            responses = await asyncio.gather(*(client.post("/orders/42/pay") for _ in range(5)))
            tokens = [r.json()["fencing_token"] for r in responses]
            print("statuses:", [r.status_code for r in responses])
            print("fencing tokens increase:", sorted(tokens) == sorted(set(tokens)))
            print("health:", (await client.get("/health")).status_code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port to serve on (default: free)")
    parser.add_argument("--check", action="store_true", help="run a self-check and exit")
    args = parser.parse_args()
    with redis_url_from_env() as redis_url:
        app = make_app(redis_url)
        if args.check:
            asyncio.run(check(app))
            return
        port = args.port or free_port()
        print(f"serving on http://127.0.0.1:{port} (Ctrl-C stops)", flush=True)
        print(f"try: curl -X POST http://127.0.0.1:{port}/orders/42/pay", flush=True)
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="info")


if __name__ == "__main__":
    main()
