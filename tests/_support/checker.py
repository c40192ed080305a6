"""Multi-process mutual-exclusion and fencing checker for aiolock.

Several OS processes, each with its own :class:`aiolock.LockManager` and many tasks,
contend for a handful of lock names against one Redis. Inside every critical section a
task verifies, through Redis itself, that nobody else is inside:

* ``INCR <run>:inside:{name}`` must read 1 on entry and ``DECR`` must read 0 on exit
  (anything else is an *overlap*; the per-process set of held names is checked too);
* a fenced store (a Lua script on ``<run>:store:{name}``) accepts a write only if its
  fencing token is higher than the highest accepted for that name, or equal to it from
  the same critical section. Each section writes on entry (its token must beat the
  previous holder's) and again just before exit (nobody with a newer token may have
  written meanwhile). A refused write is a *fenced write rejected*.

Run it::

    python -m tests._support.checker --processes 4 --tasks 8 --names 3 --acquisitions 2000
    python -m tests._support.checker ... --long      # short lease, some holds outlive it
    python -m tests._support.checker ... --redis-url redis://127.0.0.1:7000/0

or call :func:`run_check` from a test. It prints a JSON report and exits 0 when the run
is clean (every requested acquisition made, no overlap, no rejected write, no lost lock,
no error), 1 otherwise. Without ``--redis-url`` it starts its own private
``redis-server`` (:class:`aiolock.testing.RedisServer`) and stops it by pid.

Workers are this same file run as ``python checker.py --worker '<json>'`` (the repository
root on ``PYTHONPATH``), so they do not depend on how the parent imported this module.
Every loop is bounded: each task makes at most its share of acquisitions, each acquire
has a timeout, each worker stops at ``--max-seconds``, and the parent kills (by pid) any
worker that outlives that by more than a grace period.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import importlib.util
import json
import os
import random
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests._support.paths import REPO_ROOT

#: KEYS[1] = store hash; ARGV = token, section id, value.
#: Returns {1, token} when accepted, {0, highest accepted token, its section} when not.
FENCED_WRITE = """
local cur = redis.call('HMGET', KEYS[1], 'token', 'section')
local token = tonumber(ARGV[1])
local best = tonumber(cur[1])
if token == nil then
  return redis.error_reply('fenced write: token is not a number: ' .. tostring(ARGV[1]))
end
if best ~= nil and (token < best or (token == best and cur[2] ~= ARGV[2])) then
  redis.call('HINCRBY', KEYS[1], 'rejected', 1)
  return {0, cur[1], cur[2]}
end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'section', ARGV[2], 'value', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'accepted', 1)
return {1, ARGV[1]}
"""

#: error kinds that network faults may legitimately cause (``--faults``)
FAULT_ERRORS = frozenset({"LockConnectionError", "LockTimeoutError"})

_MAX_SAMPLES = 10  # error / violation descriptions kept per worker


@dataclasses.dataclass
class CheckConfig:
    """What one run does; the parent hands each worker a copy with its share."""

    processes: int = 4
    tasks: int = 8
    names: int = 3
    acquisitions: int = 2000
    long: bool = False
    lease: float = 5.0
    hold_ms: tuple[float, float] = (0.0, 2.0)
    #: fraction of sections held for ``long_hold`` x lease (only with ``long``)
    long_fraction: float = 0.0
    long_hold: float = 1.6
    acquire_timeout: float = 30.0
    max_seconds: float = 300.0
    seed: int | None = None
    #: negative control: take no lock at all (tokens from INCR), so the checker must
    #: report overlaps; proves the checks can fail
    no_lock: bool = False
    #: put a FaultProxy between the lock clients and Redis, injecting short faults
    #: (resets, latency, blackholes, refused connects) every ``fault_interval`` seconds;
    #: the checks' own client always goes straight to Redis
    faults: bool = False
    fault_interval: tuple[float, float] = (0.2, 0.8)
    #: LockManager(command_timeout=...) and the lock client's socket_timeout
    command_timeout: float | None = None
    socket_timeout: float | None = None

    @classmethod
    def for_mode(cls, *, long: bool = False, faults: bool = False, **overrides: Any) -> CheckConfig:
        """Defaults for the quick mode, or for ``--long``: a 1 s lease, and 2 % of the
        sections held 1.6 leases, so that only background renewal keeps them. With
        ``faults`` a 2 s command timeout, since a blackhole loses replies for good."""
        base = cls(long=long, faults=faults)
        if long:
            base = dataclasses.replace(
                base, lease=1.0, long_fraction=0.02, hold_ms=(0.0, 5.0), max_seconds=1800.0
            )
        if faults:
            base = dataclasses.replace(base, command_timeout=2.0)
        return dataclasses.replace(base, **overrides)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckConfig:
        fields: dict[str, Any] = dict(data)
        for key in ("hold_ms", "fault_interval"):
            if key in fields:
                fields[key] = tuple(fields[key])
        return cls(**fields)


@dataclasses.dataclass
class Tally:
    """Counts of one worker (or, summed, of a whole run)."""

    requested: int = 0
    acquisitions: int = 0
    overlaps: int = 0
    local_overlaps: int = 0
    fenced_writes_accepted: int = 0
    fenced_writes_rejected: int = 0
    locks_lost: int = 0
    #: sections whose lock.fencing_token was not an int while inside
    missing_tokens: int = 0
    acquire_failures: int = 0
    not_attempted: int = 0
    errors: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    samples: list[str] = dataclasses.field(default_factory=list)
    violations: list[str] = dataclasses.field(default_factory=list)
    #: the first description of each error kind
    first_errors: dict[str, str] = dataclasses.field(default_factory=dict)
    acquire_wait_max: float = 0.0
    acquire_wait_total: float = 0.0

    def sample(self, text: str) -> None:
        if len(self.samples) < _MAX_SAMPLES:
            self.samples.append(text)

    def violation(self, text: str) -> None:
        if len(self.violations) < _MAX_SAMPLES:
            self.violations.append(text)

    def error(self, exc: BaseException, where: str) -> None:
        kind = type(exc).__name__
        self.errors[kind] += 1
        cause = exc.__cause__
        detail = f" (from {type(cause).__name__}: {cause})" if cause is not None else ""
        text = f"{where}: {kind}: {exc}{detail}"
        self.sample(text)
        if kind not in self.first_errors:
            tb = "".join(traceback.format_exception(exc)[-6:])
            self.first_errors[kind] = f"{text}\n{tb}"[-3000:]

    def add(self, other: Tally) -> None:
        for field in (
            "requested",
            "acquisitions",
            "overlaps",
            "local_overlaps",
            "fenced_writes_accepted",
            "fenced_writes_rejected",
            "locks_lost",
            "missing_tokens",
            "acquire_failures",
            "not_attempted",
            "acquire_wait_total",
        ):
            setattr(self, field, getattr(self, field) + getattr(other, field))
        self.acquire_wait_max = max(self.acquire_wait_max, other.acquire_wait_max)
        self.errors.update(other.errors)
        for text in other.samples:
            self.sample(text)
        for text in other.violations:
            self.violation(text)
        for kind, text in other.first_errors.items():
            self.first_errors.setdefault(kind, text)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["errors"] = dict(sorted(self.errors.items()))
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Tally:
        lists = ("errors", "samples", "violations", "first_errors")
        tally = cls(**{k: v for k, v in data.items() if k not in lists})
        tally.errors = collections.Counter(data.get("errors", {}))
        tally.samples = list(data.get("samples", []))
        tally.violations = list(data.get("violations", []))
        tally.first_errors = dict(data.get("first_errors", {}))
        return tally


# -- worker ------------------------------------------------------------------------------


def _keys(run: str, name: str) -> tuple[str, str]:
    return f"{run}:inside:{{{name}}}", f"{run}:store:{{{name}}}"


async def _worker(
    config: CheckConfig, url: str, lock_url: str, run: str, index: int
) -> dict[str, Any]:
    import redis.asyncio
    from redis.commands.core import AsyncScript

    lost_error: type[Exception] = _NeverRaised
    if not config.no_lock:
        import aiolock

        lost_error = aiolock.LockLostError
    tally = Tally(requested=config.acquisitions)
    rng = random.Random(None if config.seed is None else config.seed * 1000 + index)
    names = [f"n{i}" for i in range(config.names)]
    held_here: set[str] = set()
    pid = os.getpid()
    deadline = time.monotonic() + config.max_seconds
    check = redis.asyncio.Redis.from_url(url, socket_timeout=30.0)
    lock_client = redis.asyncio.Redis.from_url(lock_url, socket_timeout=config.socket_timeout)
    fenced: AsyncScript = check.register_script(FENCED_WRITE)
    # the last few sections of each task, for explaining violations
    history: collections.defaultdict[str, collections.deque[str]] = collections.defaultdict(
        lambda: collections.deque(maxlen=4)
    )

    async def write(store: str, token: int, section: str, value: str) -> bool:
        reply = await fenced(keys=[store], args=[token, section, value])
        if int(reply[0]) == 1:
            tally.fenced_writes_accepted += 1
            return True
        tally.fenced_writes_rejected += 1
        best, by = (x.decode() if isinstance(x, bytes) else str(x) for x in reply[1:3])
        tally.violation(
            f"fenced write '{value}' of section {section} with token {token} refused: "
            f"the store holds token {best} from section {by}; this task's recent sections: "
            + " | ".join(history[section.rsplit(":", 1)[0]])
        )
        return False

    async def section(locks: Any, task: int, seq: int) -> None:
        name = rng.choice(names)
        inside, store = _keys(run, name)
        section_id = f"{pid}:{task}:{seq}"
        lock: Any = (
            _NoLock(check, f"{run}:token:{{{name}}}")
            if config.no_lock
            else locks.lock(name, timeout=config.acquire_timeout)
        )
        hold = rng.uniform(*config.hold_ms) / 1000.0
        if config.long and rng.random() < config.long_fraction:
            hold = config.long_hold * config.lease
        started = time.monotonic()
        entered = False
        events = history[f"{pid}:{task}"]
        try:
            async with lock:
                entered = True
                waited = time.monotonic() - started
                tally.acquire_wait_total += waited
                tally.acquire_wait_max = max(tally.acquire_wait_max, waited)
                tally.acquisitions += 1
                if name in held_here:
                    tally.local_overlaps += 1
                    tally.violation(f"{section_id}: {name} already held in this process")
                held_here.add(name)
                count = await check.incr(inside)
                try:
                    if count != 1:
                        tally.overlaps += 1
                        tally.violation(f"{section_id}: entered {name}, inside counter {count}")
                    token = lock.fencing_token
                    events.append(f"{section_id} {name} token {token}")
                    if not isinstance(token, int):
                        tally.missing_tokens += 1
                        tally.violation(f"{section_id}: inside {name} but fencing_token={token!r}")
                        token = -1  # the store refuses it: counted as a rejected write too
                    await write(store, token, section_id, "enter")
                    if hold > 0:
                        await asyncio.sleep(hold)
                    else:
                        await asyncio.sleep(0)
                    await write(store, token, section_id, "exit")
                finally:
                    held_here.discard(name)
                    left = await asyncio.shield(check.decr(inside))
                    if left != 0:
                        tally.overlaps += 1
                        tally.violation(f"{section_id}: leaving {name}, inside counter {left}")
            if entered:
                events.append(f"{section_id} released")
        except lost_error as exc:
            events.append(f"{section_id} {name} {type(exc).__name__}")
            tally.locks_lost += 1
            tally.sample(f"{section_id}: {name} lost after {time.monotonic() - started:.3f}s")
            if not entered:  # lost before the body ran: surprising, so an error too
                tally.acquire_failures += 1
                tally.error(exc, f"{section_id} acquire")
        except Exception as exc:
            events.append(
                f"{section_id} {name} {'after entry' if entered else 'acquire'}: {exc!r}"[:300]
            )
            if not entered:
                tally.acquire_failures += 1
            tally.error(exc, f"{section_id} {'body/release' if entered else 'acquire'}")

    async def task_loop(locks: Any, task: int, quota: int) -> None:
        for seq in range(quota):
            if time.monotonic() >= deadline:
                tally.not_attempted += quota - seq
                tally.errors["Deadline"] += 1
                return
            await section(locks, task, seq)

    async def contend(locks: Any) -> float:
        await _barrier(check, run, config.processes, deadline)
        quotas = _split(config.acquisitions, config.tasks)
        began = time.monotonic()
        await asyncio.gather(*(task_loop(locks, t, q) for t, q in enumerate(quotas)))
        return time.monotonic() - began

    manager: dict[str, Any] = {}
    try:
        if config.no_lock:
            elapsed = await contend(None)
        else:
            async with aiolock.LockManager(
                lock_client,
                prefix=f"{run}-locks",
                lease=config.lease,
                command_timeout=config.command_timeout,
                # the faults may already cut the link while the worker starts: its
                # acquisitions, not its startup, are what the checker judges
                check_on_open=False,
            ) as locks:
                elapsed = await contend(locks)
                manager = dataclasses.asdict(locks.statistics())
    finally:
        await check.aclose()
        await lock_client.aclose()
    return {"tally": tally.to_json(), "elapsed": elapsed, "pid": pid, "manager": manager}


class _NeverRaised(Exception):
    """Stands in for LockLostError when no lock is taken."""


class _NoLock:
    """The negative control's stand-in for a lock: no exclusion, a token from INCR."""

    def __init__(self, check: Any, counter: str) -> None:
        self.check = check
        self.counter = counter
        self.fencing_token = 0

    async def __aenter__(self) -> _NoLock:
        self.fencing_token = int(await self.check.incr(self.counter))
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


async def _barrier(check: Any, run: str, processes: int, deadline: float) -> None:
    """Wait (polling, bounded by *deadline*) until every worker has checked in."""
    await check.incr(f"{run}:ready")
    while time.monotonic() < deadline:
        if int(await check.get(f"{run}:ready") or 0) >= processes:
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("not every worker reached the start barrier")


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _worker_entry(payload: str) -> int:
    spec = json.loads(payload)
    config = CheckConfig.from_json(spec["config"])
    try:
        result = asyncio.run(
            _worker(config, spec["url"], spec["lock_url"], spec["run"], spec["index"])
        )
    except BaseException as exc:
        tally = Tally(requested=config.acquisitions, not_attempted=config.acquisitions)
        tally.error(exc, f"worker {spec['index']}")
        tally.sample(traceback.format_exc()[-2000:])
        result = {"tally": tally.to_json(), "elapsed": 0.0, "pid": os.getpid(), "manager": {}}
    print(json.dumps(result), flush=True)
    return 0


# -- parent ------------------------------------------------------------------------------


def run_check(config: CheckConfig, redis_url: str | None = None) -> dict[str, Any]:
    """Run the check and return the JSON-able report (see the module docstring)."""
    if redis_url is not None:
        return _run(config, redis_url)
    from aiolock.testing import RedisServer

    with RedisServer() as server:
        report = _run(config, server.url)
        report["redis"] = f"private redis-server pid {server.pid} on port {server.port}"
        return report


def _run(config: CheckConfig, url: str) -> dict[str, Any]:
    if not config.faults:
        return _run_workers(config, url, url)
    host, _, port = url.split("://", 1)[1].split("/", 1)[0].rpartition(":")
    with _ChaosProxy(host, int(port), config) as chaos:
        report = _run_workers(config, url, chaos.url)
    report["faults"] = {"injected": dict(sorted(chaos.counts.items())), "proxy": chaos.stats}
    if chaos.error is not None:
        report["faults"]["error"] = repr(chaos.error)
        report["ok"] = False
    return report


def _run_workers(config: CheckConfig, url: str, lock_url: str) -> dict[str, Any]:
    run = f"stress-{uuid.uuid4().hex[:10]}"
    shares = _split(config.acquisitions, config.processes)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    started = time.monotonic()
    procs: list[subprocess.Popen[str]] = []
    for index, share in enumerate(shares):
        spec = {
            "config": dataclasses.asdict(dataclasses.replace(config, acquisitions=share)),
            "url": url,
            "lock_url": lock_url,
            "run": run,
            "index": index,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                cwd=str(REPO_ROOT),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        )
    total = Tally()
    workers: list[dict[str, Any]] = []
    hard_deadline = started + config.max_seconds + 60.0
    for index, (proc, share) in enumerate(zip(procs, shares, strict=True)):
        try:
            out, err = proc.communicate(timeout=max(1.0, hard_deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()  # our own child, by its pid
            out, err = proc.communicate(timeout=30)
            err = f"killed after the hard deadline\n{err}"
        tally, info = _parse_worker(out, err, proc.returncode, index, share)
        total.add(tally)
        workers.append(info)
    elapsed = time.monotonic() - started
    server = _server_side(url, run, config.names)
    report: dict[str, Any] = {
        "ok": False,
        "run": run,
        "processes": config.processes,
        "tasks_per_process": config.tasks,
        "names": config.names,
        "requested": config.acquisitions,
        **{k: v for k, v in total.to_json().items() if k != "requested"},
        "elapsed": round(elapsed, 3),
        "contention_elapsed_max": round(max((w["elapsed"] for w in workers), default=0.0), 3),
        "acquisitions_per_second": round(
            total.acquisitions / max(1e-9, max((w["elapsed"] for w in workers), default=0.0)),
            1,
        ),
        "server": server,
        "workers": workers,
        "config": dataclasses.asdict(config),
    }
    report["acquire_wait_max"] = round(total.acquire_wait_max, 4)
    report["acquire_wait_total"] = round(total.acquire_wait_total, 3)
    report["accounted"] = total.acquisitions + total.acquire_failures + total.not_attempted
    safe = (
        total.overlaps == 0
        and total.local_overlaps == 0
        and total.fenced_writes_rejected == 0
        and total.missing_tokens == 0
        and server["inside_nonzero"] == {}
        and server["accepted"] == total.fenced_writes_accepted
    )
    report["safe"] = safe
    if config.faults:
        # Faults may fail acquisitions, with connection errors or timeouts only; every
        # request must still be accounted for, and some must succeed.
        unexpected = {k: n for k, n in total.errors.items() if k not in FAULT_ERRORS}
        report["unexpected_errors"] = unexpected
        report["ok"] = (
            safe
            and report["accounted"] == config.acquisitions
            and total.acquisitions > 0
            and not unexpected
        )
    else:
        report["ok"] = (
            safe
            and total.acquisitions == config.acquisitions
            and total.locks_lost == 0
            and not total.errors
        )
    return report


def _parse_worker(
    out: str, err: str, returncode: int | None, index: int, share: int
) -> tuple[Tally, dict[str, Any]]:
    lines = [line for line in out.splitlines() if line.startswith("{")]
    try:
        data = json.loads(lines[-1])
        tally = Tally.from_json(data["tally"])
        info = {"index": index, "pid": data["pid"], "elapsed": round(data["elapsed"], 3)}
        info["acquisitions"] = tally.acquisitions
        if data.get("manager"):
            info["manager"] = data["manager"]
    except (IndexError, KeyError, ValueError, TypeError):
        tally = Tally(requested=share, not_attempted=share)
        tally.errors["WorkerCrashed"] += 1
        tally.sample(f"worker {index} exited {returncode}: {err[-2000:]}")
        info = {"index": index, "pid": None, "elapsed": 0.0, "acquisitions": 0}
    if err.strip():
        info["stderr_tail"] = err[-1000:]
    return tally, info


def _server_side(url: str, run: str, names: int) -> dict[str, Any]:
    """What Redis itself says after the run: inside counters and the fenced stores."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=10.0)
    try:
        inside_nonzero: dict[str, int] = {}
        accepted = rejected = 0
        for i in range(names):
            inside, store = _keys(run, f"n{i}")
            value = int(client.get(inside) or 0)
            if value != 0:
                inside_nonzero[f"n{i}"] = value
            fields = client.hgetall(store)
            accepted += int(fields.get(b"accepted", 0))
            rejected += int(fields.get(b"rejected", 0))
        return {"inside_nonzero": inside_nonzero, "accepted": accepted, "rejected": rejected}
    finally:
        client.close()


# -- fault injection ---------------------------------------------------------------------


def _fault_proxy_class() -> Any:
    """FaultProxy from ``tests/_support/proxy.py``, loaded by path: this module runs as
    ``tests._support.checker`` (imported, or with ``python -m``) and as a script."""
    name = "_aiolock_stress_fault_proxy"
    module = sys.modules.get(name)
    if module is None:
        path = REPO_ROOT / "tests" / "_support" / "proxy.py"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module.FaultProxy


class _ChaosProxy:
    """A FaultProxy on an event loop in a thread of its own, injecting one short fault
    every ``config.fault_interval`` seconds: reset every connection, 10-100 ms latency
    for 0.5 s, a blackhole (both ways, or replies only) for 0.1-0.3 s, or refused
    connects for 0.3 s. Each fault is far shorter than the lease."""

    ACTIONS = ("drop", "latency", "blackhole", "blackhole_replies", "refuse")

    def __init__(self, upstream_host: str, upstream_port: int, config: CheckConfig) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.config = config
        self.counts: collections.Counter[str] = collections.Counter()
        self.stats: dict[str, Any] = {}
        self.url = ""
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="chaos-proxy", daemon=True)

    def __enter__(self) -> _ChaosProxy:
        self._thread.start()
        if not self._ready.wait(10.0) or not self.url:
            self._halt()
            raise RuntimeError(f"the chaos proxy did not start: {self.error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt()

    def _halt(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop may have just closed
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout=15.0)

    def _main(self) -> None:
        try:
            asyncio.run(self._chaos())
        except BaseException as exc:
            self.error = exc
        finally:
            self._ready.set()

    async def _chaos(self) -> None:
        proxy_class = _fault_proxy_class()
        self._loop = asyncio.get_running_loop()
        stop = self._stop = asyncio.Event()
        seed = self.config.seed
        rng = random.Random(None if seed is None else seed * 7919)
        low, high = self.config.fault_interval
        rounds = int(self.config.max_seconds / max(low, 0.01)) + 1
        async with proxy_class(*self.upstream) as proxy:
            self.url = proxy.url
            self._ready.set()
            for _ in range(rounds):
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), rng.uniform(low, high))
                if stop.is_set():
                    break
                action = rng.choice(self.ACTIONS)
                self.counts[action] += 1
                if action == "drop":
                    proxy.drop_all()
                elif action == "latency":
                    proxy.set_latency(rng.uniform(0.01, 0.1))
                    await asyncio.sleep(0.5)
                    proxy.set_latency(0)
                elif action in ("blackhole", "blackhole_replies"):
                    proxy.blackhole("both" if action == "blackhole" else "downstream")
                    await asyncio.sleep(rng.uniform(0.1, 0.3))
                    proxy.restore()
                else:
                    proxy.refuse(True)
                    await asyncio.sleep(0.3)
                    proxy.refuse(False)
            proxy.restore()
            self.stats = dataclasses.asdict(proxy.stats)


# -- command line ------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests._support.checker", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=8, help="tasks per process")
    parser.add_argument("--names", type=int, default=3, help="lock names contended for")
    parser.add_argument("--acquisitions", type=int, default=2000, help="total, all processes")
    parser.add_argument("--long", action="store_true", help="1 s lease; some holds outlive it")
    parser.add_argument("--lease", type=float, help="lease seconds (default 5, --long 1)")
    parser.add_argument("--acquire-timeout", type=float, help="seconds per acquire (30)")
    parser.add_argument("--max-seconds", type=float, help="stop starting sections after this")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--redis-url", help="use this server instead of a private one")
    parser.add_argument(
        "--no-lock", action="store_true", help="negative control: no locking, must fail"
    )
    parser.add_argument(
        "--faults", action="store_true", help="inject short network faults (FaultProxy)"
    )
    parser.add_argument(
        "--command-timeout", type=float, help="LockManager command_timeout (0: none)"
    )
    parser.add_argument("--socket-timeout", type=float, help="the lock client's socket_timeout")
    args = parser.parse_args(argv)
    if args.worker is not None:
        return _worker_entry(args.worker)
    for what in ("processes", "tasks", "names", "acquisitions"):
        if getattr(args, what) < 1:
            parser.error(f"--{what} must be >= 1")
    overrides: dict[str, Any] = {
        "processes": args.processes,
        "tasks": args.tasks,
        "names": args.names,
        "acquisitions": args.acquisitions,
        "seed": args.seed,
        "no_lock": args.no_lock,
    }
    for what in ("lease", "acquire_timeout", "max_seconds", "command_timeout", "socket_timeout"):
        if getattr(args, what) is not None:
            overrides[what] = getattr(args, what)
    if overrides.get("command_timeout") == 0:
        overrides["command_timeout"] = None
    config = CheckConfig.for_mode(long=args.long, faults=args.faults, **overrides)
    report = run_check(config, args.redis_url)
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
