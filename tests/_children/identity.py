"""A child process of the identity tests: ``python -m tests._children.identity URL PREFIX LEASE``.

Opens a manager named ``child-app`` (lease ``LEASE``), takes the lock ``held`` with a
fixed 60 s lease (so the lock outlives the manager's identity record once the process
dies), prints ``READY <manager id> <pid>`` and sleeps until killed (60 s at most).
"""

from __future__ import annotations

import asyncio
import os
import sys

import aiolock


async def main(url: str, prefix: str, lease: float) -> None:
    manager = aiolock.LockManager.from_url(url, prefix=prefix, lease=lease, name="child-app")
    async with manager:
        await manager.lock("held", lease=60).acquire()
        print(f"READY {manager.id} {os.getpid()}", flush=True)
        await asyncio.sleep(60)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
