"""One measurement in a fresh process: ``python -m benchmarks.worker LIB WORKLOAD ...``.

Prints one line ``BENCH-RESULT <json>`` on stdout (anything else a library prints is
ignored by the orchestrator). ``w3mp`` (and ``c2``, the same run measured for Redis CPU)
makes this process a coordinator that starts ``procs`` more workers in ``w3part`` mode and
merges their records; the parts talk to it over stdin/stdout (``READY`` -> ``GO <end>`` ->
``BENCH-RESULT`` -> ``EXIT``).
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
from typing import Any

from benchmarks import metrics, workloads
from benchmarks.adapters import ADAPTERS, LockAdapter
from benchmarks.config import ACQUIRE_TIMEOUT, FLOOR, LEASE
from benchmarks.metrics import COUNTS, Admin, ClientCounts

RESULT_PREFIX = "BENCH-RESULT "
PART_LINE_LIMIT = 256 * 1024 * 1024


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
    raise RuntimeError("a w3part process ended without a result")


async def _wait_ready(stream: asyncio.StreamReader, timeout: float) -> None:
    """Skip whatever a library prints until READY; a result line here is a failure."""
    deadline = time.monotonic() + timeout
    for _ in range(10_000):
        line = await _readline(stream, max(0.1, deadline - time.monotonic()))
        if line == "READY":
            return
        if line.startswith(RESULT_PREFIX):
            error = json.loads(line[len(RESULT_PREFIX) :]).get("error", "unknown error")
            raise RuntimeError(f"w3part failed during set-up: {error}")
        if not line and stream.at_eof():
            break
    raise RuntimeError("a w3part process ended before it was ready")


async def coordinate_w3mp(lib: str, url: str, admin: Admin, params: dict[str, Any]) -> Any:
    procs = int(params["procs"])
    seconds = float(params["seconds"])
    children: list[asyncio.subprocess.Process] = []
    try:
        for p in range(procs):
            children.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "benchmarks.worker",
                    lib,
                    "w3part",
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
        for child in children:
            assert child.stdin is not None
            child.stdin.write(f"GO {end_at!r}\n".encode())
            await child.stdin.drain()
        parts = [
            await _read_result(c.stdout, seconds + 2 * ACQUIRE_TIMEOUT)
            for c in children
            if c.stdout is not None
        ]
        end = await workloads.Window.take(admin)
        total = start.until(end)
        client = ClientCounts()
        records: list[workloads.Record] = []
        for part in parts:
            if "error" in part:
                raise RuntimeError(f"w3part failed: {part['error']}")
            client.add(ClientCounts.from_json(part["client"]))
            records.extend((str(r[0]), float(r[1]), float(r[2])) for r in part["records"])
        total["round_trips"] = client.round_trips
        total["top_level_commands"] = client.total_commands
        total["top_level_by_name"] = dict(client.commands)
        total["in_script_commands"] = max(0, total.get("all_commands", 0) - client.total_commands)
        total["cpu_s"] = sum(float(p["cpu_s"]) for p in parts)
        workloads.resent_usec(total, client.commands)
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
        print("READY", flush=True)
        line = await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), 60)
        if not line.startswith("GO "):
            return
        end_at = float(line.split()[1])
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
            }
        )
        await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), 60)
    finally:
        await adapter.teardown()


# -- entry point -----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worker")
    parser.add_argument("lib", choices=[FLOOR, *ADAPTERS])
    parser.add_argument("workload")
    parser.add_argument("--url", required=True)
    parser.add_argument("--params", default="{}")
    args = parser.parse_args(argv)
    params: dict[str, Any] = json.loads(args.params)
    metrics.install_client_counters()
    code = 0
    try:
        if args.workload == "w3part":
            asyncio.run(run_w3part(args.lib, args.url, params))
        else:
            result = asyncio.run(run_lib_workload(args.lib, args.workload, args.url, params))
            emit({"ok": True, "metrics": result})
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
