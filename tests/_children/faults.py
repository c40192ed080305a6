"""Child processes of the reliability tests: ``python -m tests._children.faults MODE JSON``.

Modes (each bounded by ``max_seconds``; each prints one event per line, flushed):

``hold``
    Open a manager (auto-renewed lease ``lease``), enter ``async with`` on ``name`` and
    print ``HELD <token>``; then sleep until killed (or ``max_seconds``).
``pause``
    Like ``hold``, but the body loops writing to a fenced store with its token (every
    ``interval`` seconds). Before each
    write it prints ``READY <n>`` and blocks, synchronously, on one line of stdin: a gate
    the test controls, so that it knows where the process stands when it stops it
    (between reading its token and writing with it, the classic spot for a GC pause). The
    store is another system, reached with a synchronous client, so a write, once begun,
    is not interrupted by the lock's cancellation. Prints ``WROTE <n> <1|0>`` per write
    and ``LOST <message>`` if ``async with`` raises ``LockLostError``.
``storm``
    Print ``READY``, wait for a line on stdin, run :func:`tests._support.storm.storm`
    and print ``REPORT <json>``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import redis

import aiolock
from tests._support.faults import FENCED_LOGGED_WRITE, store_keys
from tests._support.storm import alive_since, storm


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


async def _hold(spec: dict[str, Any]) -> None:
    manager = aiolock.LockManager.from_url(spec["url"], prefix=spec["prefix"], lease=spec["lease"])
    async with manager, manager.lock(spec["name"], timeout=30) as lock:
        _say(f"HELD {lock.fencing_token}")
        await asyncio.sleep(spec["max_seconds"])
    _say("DONE")


async def _pause(spec: dict[str, Any]) -> None:
    prefix, name = spec["prefix"], spec["name"]
    store = redis.Redis.from_url(spec["url"], socket_timeout=10)  # the protected resource
    write = store.register_script(FENCED_LOGGED_WRITE)
    deadline = time.monotonic() + spec["max_seconds"]
    manager = aiolock.LockManager.from_url(spec["url"], prefix=prefix, lease=spec["lease"])
    try:
        async with manager:
            try:
                async with manager.lock(name, timeout=30) as lock:
                    token = lock.fencing_token
                    assert isinstance(token, int)
                    _say(f"HELD {token}")
                    for n in range(1, 10_000):
                        if time.monotonic() > deadline:
                            _say("TIMEOUT")
                            return
                        _say(f"READY {n}")
                        if not sys.stdin.buffer.readline():  # the gate (blocks the loop)
                            _say("EOF")
                            return
                        accepted = write(keys=list(store_keys(prefix, name)), args=[token, "child"])
                        _say(f"WROTE {n} {int(accepted)}")
                        await asyncio.sleep(spec["interval"])
                _say("EXITED")
            except aiolock.LockLostError as exc:
                _say(f"LOST {exc}")
    finally:
        store.close()


async def _storm(spec: dict[str, Any]) -> None:
    baseline = set(asyncio.all_tasks())
    manager = aiolock.LockManager.from_url(spec["url"], prefix=spec["prefix"])
    async with manager:
        _say("READY")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.buffer.readline)
        report = await storm(
            manager,
            spec["names"],
            target=spec["target"],
            seed=spec["seed"],
            max_seconds=spec["max_seconds"],
        )
    report.after_close = alive_since(baseline)
    _say("REPORT " + json.dumps(report.to_json()))


def main() -> None:
    mode, spec = sys.argv[1], json.loads(sys.argv[2])
    run = {"hold": _hold, "pause": _pause, "storm": _storm}[mode]
    asyncio.run(asyncio.wait_for(run(spec), spec["max_seconds"] + 30))


if __name__ == "__main__":
    main()
