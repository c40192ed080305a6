"""The service benchmark: a FastAPI app under uvicorn, aiolock's dependency vs redis-py's Lock.

::

    python -m benchmarks.peers.service [--requests 2000] [--concurrency 200] [--ids 5]
                                       [--repeats 3] [--out DIR]

Starts its own ``redis-server`` (``aiolock.testing.RedisServer``, a free loopback port),
then for each repeat and each library, interleaved, serves ``benchmarks.peers.service_app`` with
``uvicorn --workers 2`` on a free loopback port, fires ``--requests`` POSTs spread round
robin over ``--ids`` hot order ids with ``--concurrency`` in flight, and records each
request's latency and outcome. The app counts critical-section overlaps itself, in Redis
(see ``service_app``); this script reads them after the load, and checks the balances
(one read-modify-write per successful request) for lost updates. Writes
``<out>/service.json`` and a section of ``<out>/RESULTS.md`` between the
``service-bench`` markers, leaving the rest of that file as it is.

Exit status: 0 when every run produced numbers and aiolock showed no overlap and no lost
update, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio

from aiolock.testing import RedisServer, free_port
from benchmarks.common.metrics import percentile
from benchmarks.common.sections import write_section
from benchmarks.peers.service_app import CHECKER_CONNECTIONS, LIBRARIES, OVERLAPS_KEY

ROOT = Path(__file__).resolve().parents[2]
REQUEST_TIMEOUT = 30.0  # seconds, per request (connect, write, read, pool)
START_TIMEOUT = 60.0  # seconds for uvicorn's two workers to answer
STOP_TIMEOUT = 10.0  # seconds between SIGTERM and SIGKILL
WARMUP_REQUESTS = 20  # on an order id of its own, before the counters are reset
WARMUP_ID = "warmup"


def log(message: str) -> None:
    print(f"[service-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- uvicorn --------------------------------------------------------------------------------


def start_uvicorn(library: str, redis_url: str, port: int, logfile: Any) -> subprocess.Popen[bytes]:
    """uvicorn with 2 workers, in a session of its own (so a SIGKILL reaches the workers)."""
    env = {**os.environ, "SERVICE_LOCK": library, "REDIS_URL": redis_url}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [
        sys.executable, "-m", "uvicorn", "benchmarks.peers.service_app:app",
        "--workers", "2", "--host", "127.0.0.1", "--port", str(port),
        "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True
    )


def stop_uvicorn(process: subprocess.Popen[bytes]) -> str:
    """SIGTERM the supervisor; SIGKILL its process group if it is not gone in 10 s."""
    if process.poll() is not None:
        return f"exited early ({process.returncode})"
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT)
        return "stopped"
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the group this script started
        process.wait(timeout=STOP_TIMEOUT)
        return "killed"


async def wait_ready(
    clients: list[httpx.AsyncClient], base: str, process: subprocess.Popen[bytes]
) -> set[int]:
    """Until both workers have answered /health (each reports its pid); their pids."""
    deadline = time.monotonic() + START_TIMEOUT
    pids: set[int] = set()
    while len(pids) < 2:
        if process.poll() is not None:
            raise RuntimeError(f"uvicorn exited with {process.returncode} before answering")
        if time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not answer from 2 workers in {START_TIMEOUT:.0f} s")
        # A new connection per probe (a kept-alive one stays with the worker that
        # accepted it), several at once so that both workers get to accept one.
        with contextlib.suppress(httpx.HTTPError):
            replies = await asyncio.gather(
                *(
                    client.get(f"{base}/health", timeout=2, headers={"Connection": "close"})
                    for client in clients[:4]
                ),
                return_exceptions=True,
            )
            for reply in replies:
                if isinstance(reply, httpx.Response) and reply.status_code == 200:
                    pids.add(int(reply.json()["pid"]))
        if len(pids) < 2:
            await asyncio.sleep(0.1)
    return pids


def cpu_seconds(pids: set[int]) -> float | None:
    """User + system CPU seconds the processes used so far (Linux /proc; None elsewhere)."""
    total = 0.0
    try:
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return total


# -- one run --------------------------------------------------------------------------------


async def reset(client: redis.asyncio.Redis, ids: list[str]) -> None:
    keys = [OVERLAPS_KEY]
    for order in [*ids, WARMUP_ID]:
        keys += [f"bench:inside:{order}", f"bench:balance:{order}"]
    await client.delete(*keys)


def quiet_httpcore_import() -> None:
    """Stop httpcore from searching ``sys.path`` for sniffio on every request.

    httpcore 1.0's ``current_async_library()`` runs ``import sniffio`` each time it sets up
    one of its locks, several per request; anyio >= 4.5 no longer installs sniffio, and a
    failed import is not cached, so each one scans every ``sys.path`` entry again. Profiled
    here, that was about a fifth of the load generator's CPU. Recording the module as
    missing makes the import fail at once, with the same outcome (httpcore then assumes
    asyncio, which this script is).
    """
    if importlib.util.find_spec("sniffio") is None:
        sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def load_clients(count: int) -> AsyncIterator[list[httpx.AsyncClient]]:
    """*count* clients of one keep-alive connection each, one per request in flight.

    Not one client with a pool of *count*: httpcore's pool walks every connection it has
    (checking each socket) for every request it assigns, so with 200 connections the load
    generator spent most of its CPU there and ran at 100% of a core, on a 2-core machine
    that also runs the service. A pool of one has nothing to walk.
    """
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    context = ssl.create_default_context()  # loaded once (never used: plain http)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT, verify=context)
            )
            for _ in range(count)
        ]
        yield clients


async def fire(
    clients: list[httpx.AsyncClient], base: str, ids: list[str], total: int
) -> tuple[list[tuple[str, float, str]], float]:
    """*total* POSTs round robin over *ids*, one in flight per client at a time.

    Returns (order id, latency in s, outcome) per request, outcome being the status code
    or the exception's class name, and the wall-clock seconds of the whole load.
    """
    results: list[tuple[str, float, str]] = []
    next_index = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal next_index
        while next_index < total:
            order = ids[next_index % len(ids)]
            next_index += 1
            started = time.monotonic()
            try:
                reply = await client.post(f"{base}/orders/{order}/pay")
                outcome = str(reply.status_code)
                if reply.status_code != 200:  # the kind of error, from the app's detail
                    outcome += f" {_detail(reply)}"
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
            results.append((order, time.monotonic() - started, outcome))

    started = time.monotonic()
    # Bounded: every request has its own 30 s timeout; the load as a whole gets a
    # generous deadline on top, in case something stalls outside httpx.
    budget = REQUEST_TIMEOUT * (total / max(1, len(clients)) + 2)
    await asyncio.wait_for(asyncio.gather(*(worker(client) for client in clients[:total])), budget)
    return results, time.monotonic() - started


def _detail(reply: httpx.Response) -> str:
    try:
        detail = reply.json().get("detail", "")
    except ValueError:
        detail = reply.text
    return str(detail)[:80]


async def one_run(
    library: str, redis_url: str, args: argparse.Namespace, logdir: Path
) -> dict[str, Any]:
    ids = [str(100 + i) for i in range(args.ids)]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    logpath = logdir / f"uvicorn-{library}-{port}.log"
    store = redis.asyncio.Redis.from_url(redis_url)
    with logpath.open("wb") as logfile:
        process = start_uvicorn(library, redis_url, port, logfile)
        stopped = "not started"
        try:
            async with load_clients(min(args.concurrency, args.requests)) as clients:
                workers = await wait_ready(clients, base, process)
                await fire(clients[:8], base, [WARMUP_ID], WARMUP_REQUESTS)
                await reset(store, ids)
                # Who spent the CPU: the load generator (this process) or the service.
                client_cpu, workers_cpu = time.process_time(), cpu_seconds(workers)
                results, seconds = await fire(clients, base, ids, args.requests)
                client_cpu = time.process_time() - client_cpu
                workers_after = cpu_seconds(workers)
                if workers_cpu is not None and workers_after is not None:
                    workers_cpu = workers_after - workers_cpu
            overlaps = int(await store.get(OVERLAPS_KEY) or 0)
            # Every section that INCRed its order's count DECRed it again, so all are 0
            # now; if not, the overlap count above cannot be trusted (and the run fails).
            inside_left = sum([int(await store.get(f"bench:inside:{order}") or 0) for order in ids])
            balances = {order: int(await store.get(f"bench:balance:{order}") or 0) for order in ids}
        finally:
            stopped = stop_uvicorn(process)
            await store.aclose()
    outcomes = Counter(outcome for _, _, outcome in results)
    ok = [latency for _, latency, outcome in results if outcome == "200"]
    ok_by_id = Counter(order for order, _, outcome in results if outcome == "200")
    every = sorted(latency for _, latency, _ in results)
    ok.sort()
    responses = sum(n for outcome, n in outcomes.items() if outcome[:3].isdigit())
    return {
        "library": library,
        "requests": len(results),
        "responses": responses,
        "ok": len(ok),
        "seconds": seconds,
        "rps": len(results) / seconds if seconds else 0.0,
        "ok_rps": len(ok) / seconds if seconds else 0.0,
        "p50_ms": percentile(ok, 50) * 1000 if ok else None,
        "p99_ms": percentile(ok, 99) * 1000 if ok else None,
        "max_ms": ok[-1] * 1000 if ok else None,
        "all_p50_ms": percentile(every, 50) * 1000 if every else None,
        "all_p99_ms": percentile(every, 99) * 1000 if every else None,
        "errors": {outcome: n for outcome, n in sorted(outcomes.items()) if outcome != "200"},
        "client_cpu_s": client_cpu,
        "workers_cpu_s": workers_cpu,
        "overlaps": overlaps,
        "checker_left": inside_left,
        # A lost update: a successful request whose read-modify-write was overwritten.
        "lost_updates": sum(max(0, ok_by_id[order] - balances[order]) for order in ids),
        "uvicorn": stopped,
    }


# -- summary and report ---------------------------------------------------------------------


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for library in LIBRARIES:
        mine = [run for run in runs if run["library"] == library and "error" not in run]
        errors: Counter[str] = Counter()
        for run in mine:
            errors.update(run["errors"])
        summary[library] = {
            "runs": len(mine),
            "failed_runs": sum(1 for run in runs if run["library"] == library and "error" in run),
            **{
                key: spread([run[key] for run in mine if run[key] is not None])
                for key in ("rps", "ok_rps", "p50_ms", "p99_ms", "max_ms")
            },
            "responses": sum(run["responses"] for run in mine),
            "errors": dict(sorted(errors.items())),
            "overlaps": sum(run["overlaps"] for run in mine),
            "lost_updates": sum(run["lost_updates"] for run in mine),
        }
    return summary


def machine_info(redis_version: str) -> dict[str, Any]:
    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "redis_server": redis_version,
        "fastapi": version("fastapi"),
        "uvicorn": version("uvicorn"),
        "httpx": version("httpx"),
        "redis_py": version("redis"),
        "aiolock": version("aiolock"),
    }


def _fmt(value: dict[str, float] | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value['median']:.{digits}f} ({value['min']:.{digits}f}-{value['max']:.{digits}f})"


def markdown(doc: dict[str, Any]) -> str:
    params, machine, summary = doc["params"], doc["machine"], doc["summary"]
    lines = [
        "## Service benchmark: FastAPI + uvicorn, aiolock vs redis-py",
        "",
        f"`python -m benchmarks.peers.service --requests {params['requests']} --concurrency "
        f"{params['concurrency']} --ids {params['ids']} --repeats {params['repeats']}`, "
        f"run {doc['started']}.",
        "",
        "Medians over the repeats, min-max in brackets. Latencies are of the successful (200) "
        "requests, client side, from sending the POST to reading the response; requests/s "
        "counts every request over the wall-clock time of the load.",
        "",
        "| library | requests/s | p50 ms | p99 ms | responses | errors | overlaps | lost updates |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for library in LIBRARIES:
        row = summary[library]
        errors = ", ".join(f"{kind}: {n}" for kind, n in row["errors"].items()) or "0"
        if row["failed_runs"]:
            errors += f"; {row['failed_runs']} failed run(s)"
        lines.append(
            f"| {library} | {_fmt(row['rps'], 0)} | {_fmt(row['p50_ms'])} | {_fmt(row['p99_ms'])} "
            f"| {row['responses']} | {errors} | {row['overlaps']} | {row['lost_updates']} |"
        )
    lines += [
        "",
        "Per run (wall s: the load's duration; client CPU s: this process, the httpx load "
        "generator; service CPU s: both uvicorn workers, from /proc):",
        "",
        "| repeat | library | requests/s | p50 ms | p99 ms | max ms | errors | overlaps "
        "| wall s | client CPU s | service CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in doc["runs"]:
        if "error" in run:
            lines.append(
                f"| {run['repeat']} | {run['library']} | failed: {run['error']} | | | | | | | | |"
            )
            continue
        errors = ", ".join(f"{kind}: {n}" for kind, n in run["errors"].items()) or "0"
        workers_cpu = "-" if run["workers_cpu_s"] is None else f"{run['workers_cpu_s']:.1f}"
        lines.append(
            f"| {run['repeat']} | {run['library']} | {run['rps']:.0f} | {run['p50_ms'] or 0:.1f} "
            f"| {run['p99_ms'] or 0:.1f} | {run['max_ms'] or 0:.1f} | {errors} "
            f"| {run['overlaps']} | {run['seconds']:.1f} | {run['client_cpu_s']:.1f} "
            f"| {workers_cpu} |"
        )
    load = doc["load_average"]
    busy = [run["client_cpu_s"] / run["seconds"] for run in doc["runs"] if run.get("seconds")]
    if busy and statistics.median(busy) > 0.8:
        # Said in the report, not left to the reader: the figures are then a ceiling.
        lines += [
            "",
            f"The load generator was CPU-bound (its CPU time was {statistics.median(busy):.0%} "
            "of the wall time, median over runs): requests/s and latencies here are "
            "limited by the one-process httpx client as much as by the service, so the "
            "comparison between the libraries holds for this setup, the absolute figures "
            "are a floor of what the service can do.",
        ]
    lines += [
        "",
        f"Machine: {machine['cpus']} CPUs, {machine['platform']}; load average (1, 5, 15 min) "
        f"{_load(load['before'])} before, {_load(load['after'])} after. "
        "The machine was shared with other work while this ran, so absolute figures are "
        "noisy; both libraries ran interleaved, repeat by repeat, under the same conditions. "
        f"Python {machine['python']}, redis-server {machine['redis_server']}, FastAPI "
        f"{machine['fastapi']}, uvicorn {machine['uvicorn']}, httpx {machine['httpx']}, "
        f"redis-py {machine['redis_py']}.",
        "",
        "Method: one private `redis-server` on a loopback port for the whole run. For each "
        "repeat and each library in turn, a fresh `uvicorn benchmarks.peers.service_app:app "
        "--workers 2` on a free loopback port; once both workers answer `/health`, "
        f"{WARMUP_REQUESTS} warm-up requests on an order of their own, then the counters are "
        f"reset and {params['concurrency']} `httpx.AsyncClient`s of one keep-alive "
        f"connection each ({REQUEST_TIMEOUT:.0f} s timeout per request) send "
        f"{params['requests']} `POST /orders/{{id}}/pay`, round robin over {params['ids']} "
        "order ids, one in flight per client (one client with a pool that large spends "
        "most of a core in httpcore's pool bookkeeping). Each request holds lock "
        "`order:{id}` "
        "(aiolock: `Depends(lock_dependency('order:{order_id}', timeout=10), "
        "scope='function')` under `lock_lifespan`; redis-py: `client.lock(name, timeout=10, "
        "blocking_timeout=10)` on a default `Redis.from_url` client, polling every 0.1 s "
        "while it waits) around a critical section that INCRs `bench:inside:{id}` (a result "
        "above 1 counts an overlap in `bench:overlaps`), does a GET/SET read-modify-write of "
        "`bench:balance:{id}` with the library's client, sleeps 2 ms and DECRs the counter; "
        "the INCR/DECR go through a client of their own (a blocking pool of "
        f"{CHECKER_CONNECTIONS} per worker), so the checker neither fails when the library's "
        "pool runs out nor uses it. Overlaps are read from Redis after the load (and every "
        "`bench:inside:{id}` must be back to 0, or the run fails); lost updates are "
        "successful requests missing from the final balances. Busy past 10 s is a 423, a "
        "lost lock 409, any other Redis error (such as redis-py's `MaxConnectionsError` "
        "when its default pool of 100 connections per client is exhausted) 503. The "
        "client, uvicorn's workers and redis-server share the machine's CPUs. Raw data: "
        "`service.json`.",
    ]
    return "\n".join(lines)


def _load(values: list[float]) -> str:
    return "/".join(f"{value:.2f}" for value in values)


# -- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peers.service", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--requests", type=int, default=2000, help="requests per run (2000)")
    parser.add_argument("--concurrency", type=int, default=200, help="requests in flight (200)")
    parser.add_argument("--ids", type=int, default=5, help="hot order ids (5)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per library (3)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    for name in ("requests", "concurrency", "ids", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


async def run(args: argparse.Namespace, server: RedisServer, logdir: Path) -> dict[str, Any]:
    admin = redis.asyncio.Redis.from_url(server.url)
    try:
        info = await admin.info("server")
    finally:
        await admin.aclose()
    load_before = list(os.getloadavg())
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    runs: list[dict[str, Any]] = []
    for repeat in range(1, args.repeats + 1):
        # Interleaved, and alternating which goes first, so drift in the machine's load
        # falls on both libraries alike.
        order = LIBRARIES if repeat % 2 else tuple(reversed(LIBRARIES))
        for library in order:
            log(f"repeat {repeat}/{args.repeats}: {library}")
            try:
                result = await one_run(library, server.url, args, logdir)
            except Exception as exc:  # a failed run is recorded, the others still run
                result = {"library": library, "error": f"{type(exc).__name__}: {exc}"}
                log(f"  failed: {result['error']}")
            else:
                log(
                    f"  {result['rps']:.0f} req/s, p50 {result['p50_ms'] or 0:.1f} ms, "
                    f"p99 {result['p99_ms'] or 0:.1f} ms, errors {result['errors'] or 0}, "
                    f"overlaps {result['overlaps']}, lost updates {result['lost_updates']}"
                )
            runs.append({"repeat": repeat, **result})
    return {
        "started": started,
        "params": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "ids": args.ids,
            "repeats": args.repeats,
            "lock_timeout_s": 10,
            "request_timeout_s": REQUEST_TIMEOUT,
        },
        "machine": machine_info(str(info.get("redis_version", "?"))),
        "load_average": {"before": load_before, "after": list(os.getloadavg())},
        "runs": runs,
        "summary": summarize(runs),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_httpcore_import()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="service-bench-") as tmp, RedisServer() as server:
        doc = asyncio.run(run(args, server, Path(tmp)))
        failed = [run for run in doc["runs"] if "error" in run]
        for run_ in failed:  # show the uvicorn log of a failed run before it is deleted
            for logfile in Path(tmp).glob(f"uvicorn-{run_['library']}-*.log"):
                log(f"{logfile.name}:\n{logfile.read_text(errors='replace')[-2000:]}")
    (args.out / "service.json").write_text(json.dumps(doc, indent=1) + "\n")
    write_section(args.out / "RESULTS.md", "service", markdown(doc))
    log(f"wrote {args.out / 'service.json'} and the service section of {args.out / 'RESULTS.md'}")
    mine = doc["summary"]["aiolock"]
    unsafe = mine["overlaps"] or mine["lost_updates"] or not mine["p50_ms"]  # or no 200 at all
    unchecked = any(run.get("checker_left") for run in doc["runs"])  # see one_run
    return 1 if failed or unsafe or unchecked else 0


if __name__ == "__main__":
    sys.exit(main())
