"""Workload names and the parameters of the quick and full profiles."""

from __future__ import annotations

from typing import Any

#: Workload id -> one-line description (the report's section titles).
WORKLOADS: dict[str, str] = {
    "w0": "W0 floor: raw redis.asyncio, two EVALSHA of a trivial script per cycle, one task",
    "w1": "W1 uncontended: one task, acquire+release cycles on one name",
    "w2": "W2 concurrency: 64 tasks on distinct names",
    "w2mp": "W2 concurrency: 4 processes x 64 tasks, each task on its own name",
    "w3": "W3 contention: 16 tasks on one name, one process",
    "w3mp": "W3 contention: 4 processes x 4 tasks on one name",
    "w4": "W4 many waiters: one holder keeps the lock while 500 tasks wait",
    "w5": "W5 many holds: 10,000 locks held at once with renewal on",
    "c1": "C1 Redis cost: server time of the commands sent per uncontended acquire+release cycle",
    "c2": "C2 Redis cost: server CPU per contended acquisition, 4 processes x 4 tasks on one name",
    "c3": "C3 Redis cost: memory left per used name after release",
}
#: Workloads run once per library (W0 is library-independent and runs once, as "floor").
LIB_WORKLOADS = [w for w in WORKLOADS if w != "w0"]
FLOOR = "floor"
#: The workloads the baseline library (aiolock at an older revision, ``--baseline``) runs.
BASELINE_WORKLOADS = ("w1", "w2", "w2mp")
#: The revision ``--baseline`` extracts by default: main just before issue 21 (the scripts
#: with a key per piece of state, no fast path in the engine).
BASELINE_REV = "4e256a95aa8b236cb334d46c0112924f3ccb60ea"
#: Names for groups of workloads on the command line (``--workloads cost``).
GROUPS: dict[str, list[str]] = {"cost": ["c1", "c2", "c3"]}

#: Lease used by W1-W4 (long enough that nothing expires during a run).
LEASE = 10.0
#: Per-acquire timeout in W1-W4; a run that hits it reports an error instead of numbers.
ACQUIRE_TIMEOUT = 20.0

PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "quick": {
        "w0": {"cycles": 3000, "seconds": 0.5},
        "w1": {"cycles": 3000, "seconds": 0.5},
        "w2": {"tasks": 64, "seconds": 0.5},
        "w2mp": {"procs": 4, "tasks": 64, "seconds": 0.5},
        "w3": {"tasks": 16, "seconds": 0.6},
        "w3mp": {"procs": 4, "tasks": 4, "seconds": 0.6},
        "w4": {"waiters": 500, "hold": 1.0, "settle": 0.2, "serve_timeout": 3.0},
        # a 6 s lease: taking the locks must finish within 0.9 lease. A loaded CI machine
        # (several suites at once) took 3.2 s for 1,000, a fresh-clone run at
        # load average 6 on 2 cores 6.0 s: 300 keep the quick run's check of
        # the harness 3x inside that, with the same window of one lease
        "w5": {"locks": 300, "lease": 6.0, "periods": 1.0, "acquire_seconds": 20.0},
        # enough cycles that the server's CPU time (INFO cpu, sampled by the kernel's
        # ticks) moves even on a loaded machine: 300 read 0.0 once
        "c1": {"cycles": 2000, "seconds": 1.0},
        "c2": {"procs": 4, "tasks": 4, "seconds": 0.5, "idle": 0.2},
        "c3": {"names": 200, "reused_names": 20, "reuses": 10, "seconds": 5.0, "settle": 0.2},
    },
    "full": {
        "w0": {"cycles": 20000, "seconds": 8.0},
        "w1": {"cycles": 20000, "seconds": 8.0},
        "w2": {"tasks": 64, "seconds": 4.0},
        "w2mp": {"procs": 4, "tasks": 64, "seconds": 4.0},
        "w3": {"tasks": 16, "seconds": 4.0},
        "w3mp": {"procs": 4, "tasks": 4, "seconds": 4.0},
        "w4": {"waiters": 500, "hold": 3.0, "settle": 0.3, "serve_timeout": 20.0},
        "w5": {"locks": 10000, "lease": 15.0, "periods": 2.0, "acquire_seconds": 60.0},
        "c1": {"cycles": 3000, "seconds": 3.0},
        "c2": {"procs": 4, "tasks": 4, "seconds": 2.0, "idle": 0.5},
        "c3": {"names": 2000, "reused_names": 200, "reuses": 10, "seconds": 20.0, "settle": 0.5},
    },
}
#: How often each workload is repeated (fresh process each time); the report shows medians.
REPEATS: dict[str, dict[str, int]] = {
    "quick": {},
    "full": {"w0": 3, "w1": 3, "w2": 3, "w2mp": 3, "w3": 3, "w3mp": 3, "c1": 3, "c2": 3},
}
#: Wall-clock limit for one worker process, in seconds.
RUN_TIMEOUT = {"quick": 60.0, "full": 240.0}
