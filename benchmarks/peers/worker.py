"""One measurement in a fresh process: ``python -m benchmarks.peers.worker LIB WORKLOAD ...``.

Prints one line ``BENCH-RESULT <json>`` on stdout (anything else a library prints is
ignored by the orchestrator). ``w3mp`` (and ``c2``, the same run measured for Redis CPU)
makes this process a coordinator that starts ``procs`` more workers in ``w3part`` mode and
merges their records, ``w2mp`` the same with ``w2part`` workers; the parts talk to it over
stdin/stdout (``READY`` -> ``GO <end>`` -> ``BENCH-RESULT`` -> ``EXIT``). A result names
the ``aiolock`` package files this process and its parts imported (``aiolock_files``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import time
import traceback
from collections.abc import AsyncIterator
from typing import Any

from benchmarks.common import metrics
from benchmarks.common.metrics import COUNTS, Admin, ClientCounts
from benchmarks.peers import workloads
from benchmarks.peers.adapters import ADAPTERS, LockAdapter
from benchmarks.peers.config import ACQUIRE_TIMEOUT, FLOOR, LEASE

RESULT_PREFIX = "BENCH-RESULT "
PART_LINE_LIMIT = 256 * 1024 * 1024
#: ``aiolock.__file__`` of this process and of its part processes, where they imported it.
IMPORTED: set[str] = set()


def aiolock_file() -> str | None:
    """The ``__file__`` of the ``aiolock`` package this process imported, if it did."""
    module = sys.modules.get("aiolock")
    return str(module.__file__) if module is not None and module.__file__ else None


def clean(value: Any) -> Any:
    """NaN/inf -> None, recursively, so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def emit(result: dict[str, Any]) -> None:
    sys.stdout.write(RESULT_PREFIX + json.dumps(clean(result)) + "\n")
    sys.stdout.flush()


def make_adapter(lib: str) -> LockAdapter:
    if lib == "aioredlock":
        metrics.install_aioredis_counters()
    return ADAPTERS[lib]()


async def run_lib_workload(lib: str, workload: str, url: str, params: dict[str, Any]) -> Any:
    admin = Admin(url)
    try:
        await admin.ping()
        if workload == "w0":
            return await workloads.w0_floor(url, admin, params)
        if workload in ("w3mp", "c2"):
            return await coordinate_w3mp(lib, url, admin, params)
        if workload == "w2mp":
            return await coordinate_w2mp(lib, url, admin, params)
        adapter = make_adapter(lib)
        lease = float(params.get("lease", LEASE))
        await adapter.setup(url, lease, workloads.CONCURRENCY[workload])
        try:
            return await workloads.LOCK_WORKLOADS[workload](adapter, admin, params)
        finally:
            # No timeout wrapper here: aiolock's LockManager holds an anyio task group that
            # must be exited in the task and cancel scope it was entered in. The process as
            # a whole is bounded by the orchestrator's timeout.
            await adapter.teardown()
    finally:
        await admin.close()


# -- W3 across processes ---------------------------------------------------------------


async def _readline(stream: asyncio.StreamReader, timeout: float) -> str:
    line = await asyncio.wait_for(stream.readline(), timeout)
    return line.decode(errors="replace").strip()


async def _read_result(stream: asyncio.StreamReader, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    for _ in range(10_000):
        line = await _readline(stream, max(0.1, deadline - time.monotonic()))
        if line.startswith(RESULT_PREFIX):
            data: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            return data
        if not line and stream.at_eof():
            break
    raise RuntimeError("a part process ended without a result")


async def _wait_ready(stream: asyncio.StreamReader, timeout: float) -> None:
    """Skip whatever a library prints until READY; a result line here is a failure."""
    deadline = time.monotonic() + timeout
    for _ in range(10_000):
        line = await _readline(stream, max(0.1, deadline - time.monotonic()))
        if line == "READY":
            return
        if line.startswith(RESULT_PREFIX):
            error = json.loads(line[len(RESULT_PREFIX) :]).get("error", "unknown error")
            raise RuntimeError(f"a part process failed during set-up: {error}")
        if not line and stream.at_eof():
            break
    raise RuntimeError("a part process ended before it was ready")


@contextlib.asynccontextmanager
async def started_parts(
    lib: str, url: str, params: dict[str, Any], mode: str
) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """``procs`` worker processes in *mode* (``w3part``, ``w2part``), each READY; at the
    end each is told EXIT and waited for (killed after 15 s)."""
    children: list[asyncio.subprocess.Process] = []
    try:
        for p in range(int(params["procs"])):
            children.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "benchmarks.peers.worker",
                    lib,
                    mode,
                    "--url",
                    url,
                    "--params",
                    json.dumps({**params, "part": p}),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    limit=PART_LINE_LIMIT,  # a part's result line carries all its records
                )
            )
        for child in children:
            assert child.stdout is not None
            await _wait_ready(child.stdout, 30)
        yield children
    finally:
        for child in children:
            if child.stdin is not None and not child.stdin.is_closing():
                with contextlib.suppress(OSError):
                    child.stdin.write(b"EXIT\n")
                    child.stdin.close()
        for child in children:
            try:
                await asyncio.wait_for(child.wait(), 15)
            except asyncio.TimeoutError:
                child.kill()
                await child.wait()


async def send_go(children: list[asyncio.subprocess.Process], end_at: float) -> None:
    for child in children:
        assert child.stdin is not None
        child.stdin.write(f"GO {end_at!r}\n".encode())
        await child.stdin.drain()


async def read_parts(
    children: list[asyncio.subprocess.Process], timeout: float
) -> list[dict[str, Any]]:
    """Every part's result; a part's error fails the whole run. Notes which ``aiolock``
    each part imported (:data:`IMPORTED`)."""
    parts = [await _read_result(c.stdout, timeout) for c in children if c.stdout is not None]
    for part in parts:
        if "error" in part:
            raise RuntimeError(f"a part process failed: {part['error']}")
        if part.get("aiolock_file"):
            IMPORTED.add(str(part["aiolock_file"]))
    return parts


def merged_window(
    start: workloads.Window, end: workloads.Window, parts: list[dict[str, Any]]
) -> dict[str, Any]:
    """The server's deltas over the window, with the parts' client counts and CPU (this
    process sent nothing in between)."""
    total = start.until(end)
    client = ClientCounts()
    for part in parts:
        client.add(ClientCounts.from_json(part["client"]))
    total["round_trips"] = client.round_trips
    total["top_level_commands"] = client.total_commands
    total["top_level_by_name"] = dict(client.commands)
    total["in_script_commands"] = max(0, total.get("all_commands", 0) - client.total_commands)
    total["cpu_s"] = sum(float(p["cpu_s"]) for p in parts)
    workloads.resent_usec(total, client.commands)
    return total


async def coordinate_w3mp(lib: str, url: str, admin: Admin, params: dict[str, Any]) -> Any:
    async with started_parts(lib, url, params, "w3part") as children:
        return await _measure_w3mp(children, admin, params)


async def _measure_w3mp(
    children: list[asyncio.subprocess.Process], admin: Admin, params: dict[str, Any]
) -> Any:
    procs = int(params["procs"])
    seconds = float(params["seconds"])
    idle: dict[str, Any] = {}
    if params.get("idle"):
        # The server's CPU while every part is connected and waiting for GO: its
        # background (cron, idle connections) per second, to compare with the window.
        quiet = await workloads.Window.take(admin)
        await asyncio.sleep(float(params["idle"]))
        idle = quiet.until(await workloads.Window.take(admin))
    conns = asyncio.ensure_future(workloads.sample_connections(admin, 0.1 + seconds / 2))
    start = await workloads.Window.take(admin)
    end_at = start.wall + seconds
    await send_go(children, end_at)
    parts = await read_parts(children, seconds + 2 * ACQUIRE_TIMEOUT)
    end = await workloads.Window.take(admin)
    total = merged_window(start, end, parts)
    records: list[workloads.Record] = []
    for part in parts:
        records.extend((str(r[0]), float(r[1]), float(r[2])) for r in part["records"])
    out = workloads.contention_metrics(records, start.wall, end_at)
    if idle.get("wall_s"):
        total["server_idle_cpu_per_s"] = idle["server_cpu_s"] / idle["wall_s"]
        total["server_idle_commands"] = idle.get("all_commands")
    return {
        "procs": procs,
        "tasks": procs * int(params["tasks"]),
        **out,
        "mutex_violations_within_process": sum(int(p["violations"]) for p in parts),
        "cancelled_waits": sum(int(p["cancelled"]) for p in parts),
        **total,
        **workloads.per(total, out["acquisitions"]),
        "connections": await conns,
    }


# -- W2 across processes ---------------------------------------------------------------


async def coordinate_w2mp(lib: str, url: str, admin: Admin, params: dict[str, Any]) -> Any:
    """W2 in ``procs`` processes at once, ``tasks`` tasks each, every task on a name of
    its own: the total cycles per second of the window from GO to the last part's end."""
    seconds = float(params["seconds"])
    async with started_parts(lib, url, params, "w2part") as children:
        conns = asyncio.ensure_future(workloads.sample_connections(admin, 0.1 + seconds / 2))
        start = await workloads.Window.take(admin)
        await send_go(children, start.wall + seconds)
        parts = await read_parts(children, seconds + 2 * ACQUIRE_TIMEOUT)
        end = await workloads.Window.take(admin)
        total = merged_window(start, end, parts)
        counts = [int(c) for part in parts for c in part["counts"]]
        n = sum(counts)
        # Parts start on GO (sent at start.wall) and end after their last cycle: the
        # window is what the clock says from GO to the last one's end (system-wide
        # CLOCK_MONOTONIC), not including the results' transfer.
        window = max(float(p["ended"]) for p in parts) - start.wall
        return {
            "procs": len(parts),
            "tasks": len(counts),
            "cycles": n,
            "cycles_per_s": n / window if window > 0 else 0.0,
            "window_s": window,
            "min_task_cycles": min(counts) if counts else 0,
            "min_process_cycles": min(sum(p["counts"]) for p in parts) if parts else 0,
            **total,
            **workloads.per(total, n),
            "connections": await conns,
        }


async def _await_go(loop: asyncio.AbstractEventLoop) -> float | None:
    """Say READY, then wait for ``GO <end>``; the end time, or None if told otherwise."""
    print("READY", flush=True)
    line = await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), 60)
    return float(line.split()[1]) if line.startswith("GO ") else None


async def run_w2part(lib: str, url: str, params: dict[str, Any]) -> None:
    """One of the w2mp processes: set up, warm up, say READY, run on GO, print, wait."""
    loop = asyncio.get_running_loop()
    adapter = make_adapter(lib)
    await adapter.setup(url, LEASE, int(params["tasks"]))
    try:
        names = [f"w2mp:p{params['part']}:{i}" for i in range(int(params["tasks"]))]
        await workloads.warm_names(adapter, names)
        end_at = await _await_go(loop)
        if end_at is None:
            return
        before, cpu0 = COUNTS.copy(), time.process_time()
        counts = await workloads.cycle_names(adapter, names, end_at)
        emit(
            {
                "counts": counts,
                "ended": time.monotonic(),
                "client": COUNTS.minus(before).to_json(),
                "cpu_s": time.process_time() - cpu0,
                "aiolock_file": aiolock_file(),
            }
        )
        await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), 60)
    finally:
        await adapter.teardown()


async def run_w3part(lib: str, url: str, params: dict[str, Any]) -> None:
    """One of the w3mp processes: set up, say READY, run on GO, print, wait for EXIT."""
    loop = asyncio.get_running_loop()
    adapter = make_adapter(lib)
    await adapter.setup(url, LEASE, int(params["tasks"]))
    try:
        # Warm-up: every task contends briefly, so connections and scripts exist already.
        await workloads.contend(
            adapter, int(params["tasks"]), time.monotonic() + 0.1, "warm", 1.0, "w3:warm"
        )
        end_at = await _await_go(loop)
        if end_at is None:
            return
        before, cpu0 = COUNTS.copy(), time.process_time()
        records, violations, cancelled = await workloads.contend(
            adapter, int(params["tasks"]), end_at, f"p{params['part']}t"
        )
        emit(
            {
                "records": records,
                "violations": violations,
                "cancelled": cancelled,
                "client": COUNTS.minus(before).to_json(),
                "cpu_s": time.process_time() - cpu0,
                "aiolock_file": aiolock_file(),
            }
        )
        await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), 60)
    finally:
        await adapter.teardown()


# -- entry point -----------------------------------------------------------------------

PARTS = {"w2part": run_w2part, "w3part": run_w3part}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers.worker")
    parser.add_argument("lib", choices=[FLOOR, *ADAPTERS])
    parser.add_argument("workload")
    parser.add_argument("--url", required=True)
    parser.add_argument("--params", default="{}")
    args = parser.parse_args(argv)
    params: dict[str, Any] = json.loads(args.params)
    metrics.install_client_counters()
    code = 0
    try:
        if args.workload in PARTS:
            asyncio.run(PARTS[args.workload](args.lib, args.url, params))
        else:
            result = asyncio.run(run_lib_workload(args.lib, args.workload, args.url, params))
            if own := aiolock_file():
                IMPORTED.add(own)
            # Which aiolock package this process and its parts ran: the orchestrator
            # refuses a baseline result that did not run the extracted revision.
            emit({"ok": True, "metrics": result, "aiolock_files": sorted(IMPORTED)})
    except Exception as exc:
        detail = traceback.format_exc(limit=6)
        emit({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": detail})
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Threads a synchronous library left blocked (e.g. in BLPOP) must not keep us alive.
    os._exit(code)


if __name__ == "__main__":
    main()
