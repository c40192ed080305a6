"""Run the benchmark suite: ``python -m benchmarks [--quick] [--libs ...] [--workloads ...]``.

Starts a private redis-server on a free loopback port (:class:`aiolock.testing.RedisServer`),
runs every selected workload for every selected library in a fresh worker process
(``python -m benchmarks.peers.worker``), flushing the server between runs, and writes
``RESULTS.md``, ``results.json`` and PNG plots to ``--out`` (default
``benchmarks/results``). ``--baseline REV`` (default: main before issue 21; ``none`` to
skip) adds ``aiolock-pre21``, that revision's ``aiolock/`` run by the same adapter, to W1,
W2 and W2mp. Repeats are interleaved across libraries; when W0 and W1 both run, W0's
floor repeats are interleaved with W1's (round k: floor, then each library), so that the
W1-vs-floor targets are judged on the median of the per-round ratios
(:mod:`benchmarks.common.paired`). Exits 1 if an aiolock, baseline or floor run failed (peers'
failures are recorded as results), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from aiolock.testing import RedisServer, find_redis_server
from benchmarks.common.metrics import ADMIN_NAME
from benchmarks.peers import report
from benchmarks.peers.adapters import ADAPTERS, BASELINE
from benchmarks.peers.baseline import Baseline, extracted, refusal
from benchmarks.peers.config import (
    BASELINE_REV,
    BASELINE_WORKLOADS,
    FLOOR,
    GROUPS,
    PROFILES,
    REPEATS,
    RUN_TIMEOUT,
    WORKLOADS,
)
from benchmarks.peers.worker import RESULT_PREFIX

ROOT = Path(__file__).resolve().parents[2]
#: The metric that picks the median repeat of each workload.
KEY_METRIC = {
    "w0": "cycles_per_s",
    "w1": "cycles_per_s",
    "w2": "cycles_per_s",
    "w2mp": "cycles_per_s",
    "w3": "acquisitions_per_s",
    "w3mp": "acquisitions_per_s",
    "w4": "all_served_s",
    "w5": "renew_round_trips_per_period",
    "c1": "sent_us_per_op",
    "c2": "server_cpu_us_per_op",
    "c3": "bytes_left_per_name",
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_list(
    value: str | None,
    allowed: list[str],
    what: str,
    groups: dict[str, list[str]] | None = None,
) -> list[str]:
    """The chosen items of a comma list, in *allowed*'s order; a group name stands for
    its members (``cost`` = ``c1,c2,c3``)."""
    if not value:
        return list(allowed)
    chosen: list[str] = []
    for v in (v.strip() for v in value.split(",")):
        if v:
            chosen.extend((groups or {}).get(v, [v]))
    unknown = [v for v in chosen if v not in allowed]
    if unknown:
        raise ValueError(f"unknown {what}: {', '.join(unknown)} (choose from {', '.join(allowed)})")
    return [v for v in allowed if v in chosen]


def run_worker(
    lib: str,
    workload: str,
    url: str,
    params: dict[str, Any],
    timeout: float,
    baseline: Baseline | None = None,
) -> Any:
    """One fresh worker process; returns its parsed result (``ok``/``metrics``/``error``).

    The worker runs from the repository root, so ``-m`` imports this checkout's
    ``aiolock`` and ``benchmarks`` packages; the baseline library's from the extracted
    revision's directory, with that first on ``PYTHONPATH`` (a result that imported
    another ``aiolock`` is refused).
    """
    cwd, env = ROOT, None
    if lib == BASELINE:
        if baseline is None:
            return {"ok": False, "error": "no baseline revision was extracted"}
        cwd, env = baseline.worker_env(ROOT)
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.peers.worker",
        lib,
        workload,
        "--url",
        url,
        "--params",
        json.dumps(params),
    ]
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"worker timed out after {timeout:.0f} s (killed)"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
            why = refusal(result, baseline) if baseline and lib == BASELINE else None
            if why and result.get("ok"):
                return {**result, "ok": False, "error": f"baseline result refused: {why}"}
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {
        "ok": False,
        "error": f"worker exited {proc.returncode} without a result: " + " | ".join(tail),
    }


def wait_for_clients_gone(admin: redis.Redis, limit_s: float = 3.0) -> int:
    """Wait (bounded) until only our own connection is left; return the leftover count."""
    deadline = time.monotonic() + limit_s
    left = 0
    while time.monotonic() < deadline:
        left = sum(1 for c in admin.client_list() if c.get("name") != ADMIN_NAME)
        if left <= 0:
            return 0
        time.sleep(0.05)
    return left


def combine(workload: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median repeat (by the workload's key metric), plus the key metric's spread and
    its value per repeat (*runs* in repeat order)."""
    ok = [r for r in runs if r.get("ok")]
    if not ok:
        return {"ok": False, "error": runs[-1].get("error", "failed") if runs else "not run"}
    key = KEY_METRIC[workload]
    valued = [r for r in ok if isinstance(r["metrics"].get(key), (int, float))]
    if valued:
        valued.sort(key=lambda r: float(r["metrics"][key]))
        chosen = valued[(len(valued) - 1) // 2]
    else:
        chosen = ok[0]
    values = [float(r["metrics"][key]) for r in valued]
    # the same values in repeat order (None: a failed repeat), for ratios taken round by
    # round against another subject of the same rounds (benchmarks.common.paired)
    by_repeat = [
        float(r["metrics"][key])
        if r.get("ok") and isinstance(r["metrics"].get(key), (int, float))
        else None
        for r in runs
    ]
    return {
        "ok": True,
        "metrics": chosen["metrics"],
        "repeats": len(runs),
        "failed_repeats": len(runs) - len(ok),
        "key_metric": key,
        "key_values": values,
        "key_median": statistics.median(values) if values else None,
        "key_by_repeat": by_repeat,
    }


def versions(libs: list[str], baseline: Baseline | None) -> dict[str, str]:
    out = {"redis (redis-py)": ADAPTERS["redis-py"].version()}
    for lib in libs:
        if lib == BASELINE and baseline is not None:
            out[lib] = baseline.label()
            continue
        try:
            out[lib] = ADAPTERS[lib].version()
        except Exception as exc:  # a library that does not even import
            out[lib] = f"unavailable ({type(exc).__name__}: {exc})"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs (< 1 minute total)")
    parser.add_argument("--libs", help=f"comma list of {', '.join(ADAPTERS)}")
    parser.add_argument(
        "--workloads",
        help=f"comma list of {', '.join(WORKLOADS)}, or a group: "
        + ", ".join(f"{g} = {','.join(ws)}" for g, ws in GROUPS.items()),
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--repeats", type=int, help="override repeats per workload")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--baseline",
        default=BASELINE_REV,
        metavar="REV",
        help=f"git revision whose aiolock/ runs as {BASELINE} in "
        f"{', '.join(BASELINE_WORKLOADS)} (default: {BASELINE_REV[:12]}, main before "
        "issue 21); 'none' to skip",
    )
    args = parser.parse_args(argv)

    try:
        libs = parse_list(args.libs, list(ADAPTERS), "libraries")
        selected = parse_list(args.workloads, list(WORKLOADS), "workloads", GROUPS)
    except ValueError as exc:
        parser.error(str(exc))  # exits 2
    # The baseline's extracted copy lives until every run is over.
    with contextlib.ExitStack() as stack:
        baseline, note = prepare_baseline(stack, args.baseline, libs, selected)
        if baseline is None:
            libs = [lib for lib in libs if lib != BASELINE]
        return run_suite(args, argv, libs, selected, baseline, note)


def prepare_baseline(
    stack: contextlib.ExitStack, rev: str, libs: list[str], selected: list[str]
) -> tuple[Baseline | None, str]:
    """The extracted baseline when the run needs one, and what the report says of it."""
    if BASELINE not in libs or not any(w in BASELINE_WORKLOADS for w in selected):
        return None, ""
    if rev.lower() == "none":
        note = "Baseline skipped: --baseline none"
    else:
        got = stack.enter_context(extracted(ROOT, rev))
        if isinstance(got, Baseline):
            log(f"baseline {BASELINE}: {got.label()}, in {got.root}")
            return got, f"Baseline: {BASELINE} = aiolock at {got.label()}"
        note = got
    log(note)
    return None, note


def schedule(selected: list[str]) -> list[list[str]]:
    """The workloads that run together, round by round, in the order they run.

    W0's floor runs beside W1 when both are selected (round k: floor, library A, B, ...),
    so every W1 repeat has a floor repeat taken in the same minute of the machine's load
    and the W1-vs-floor targets can be judged round by round; every other
    workload, and W0 or W1 alone, runs by itself.
    """
    if "w0" in selected and "w1" in selected:
        return [["w0", "w1"], *([w] for w in selected if w not in ("w0", "w1"))]
    return [[w] for w in selected]


def run_targets(workload: str, libs: list[str]) -> list[str]:
    """Who runs *workload*: the floor alone for W0, else the libraries (the baseline only
    in its workloads)."""
    if workload == "w0":
        return [FLOOR]
    if workload not in BASELINE_WORKLOADS:
        return [lib for lib in libs if lib != BASELINE]
    return list(libs)


def run_group(
    args: argparse.Namespace,
    group: list[str],
    libs: list[str],
    profile: str,
    url: str,
    admin: redis.Redis,
    baseline: Baseline | None,
    runs: list[dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Run *group*'s workloads for every library, round by round; their summaries.

    Repeats are interleaved (round k: every workload of the group, each for lib A, B, C)
    so that drifting load on the machine affects every library alike; a workload with
    fewer repeats than another of its group sits out the last rounds. Each record is
    appended to *runs* as it completes.
    """
    repeats = {w: args.repeats or REPEATS[profile].get(w, 1) for w in group}
    who = {w: run_targets(w, libs) for w in group}
    done: dict[tuple[str, str], list[dict[str, Any]]] = {
        (w, lib): [] for w in group for lib in who[w]
    }
    for rep in range(max(repeats.values())):
        for workload in group:
            if rep >= repeats[workload]:
                continue
            for lib in who[workload]:
                admin.flushall()
                t0 = time.monotonic()
                result = run_worker(
                    lib,
                    workload,
                    url,
                    PROFILES[profile][workload],
                    RUN_TIMEOUT[profile],
                    baseline,
                )
                leftover = wait_for_clients_gone(admin)
                record = {
                    "lib": lib,
                    "workload": workload,
                    "repeat": rep,
                    "seconds": time.monotonic() - t0,
                    "leftover_clients": leftover,
                    **result,
                }
                done[(workload, lib)].append(record)
                runs.append(record)
                log(report.progress_line(record))
    summary: dict[str, dict[str, Any]] = {}
    for workload in group:
        summary[workload] = {lib: combine(workload, done[(workload, lib)]) for lib in who[workload]}
        if len(group) > 1:
            # what the report pairs round by round (repeat k of each ran in round k)
            for entry in summary[workload].values():
                entry["interleaved_with"] = [w for w in group if w != workload]
    return summary


def run_suite(
    args: argparse.Namespace,
    argv: list[str] | None,
    libs: list[str],
    selected: list[str],
    baseline: Baseline | None,
    baseline_note: str,
) -> int:
    """Run every selected (workload, library) pair, write the reports, return the status."""
    profile = "quick" if args.quick else "full"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    summary: dict[str, dict[str, Any]] = {}
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url, client_name=ADMIN_NAME)
        server_version = str(admin.info("server").get("redis_version", "?"))
        for group in schedule(selected):
            summary.update(run_group(args, group, libs, profile, server.url, admin, baseline, runs))
        admin.flushall()
        admin.close()

    meta = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "profile": profile,
        "command": "python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:]),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "redis_server": server_version,
        "redis_server_binary": find_redis_server(),
        "versions": versions(libs, baseline),
        "baseline": baseline_note,
        "params": {w: PROFILES[profile][w] for w in selected},
        "interleaved": [group for group in schedule(selected) if len(group) > 1],
        "total_seconds": time.monotonic() - started,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    report.write_all(out, meta, summary, runs, plots=not args.no_plots)
    log(f"wrote {out / 'RESULTS.md'} in {meta['total_seconds']:.1f} s")
    broken = [r for r in runs if not r.get("ok") and r["lib"] in ("aiolock", BASELINE, FLOOR)]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
