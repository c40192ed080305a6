"""Measurement helpers: client-side command/round-trip counters, server-side INFO
commandstats deltas, CLIENT LIST connection counts, latency summaries and memory.

Counting method (also documented in ``benchmarks/README.md``):

* **Round trips** are counted on the client, as the number of socket writes a library
  makes: every call of ``send_packed_command`` on a redis-py connection (asyncio or
  sync) is one round trip, so a pipeline flush counts once whatever its length, and a
  pub/sub SUBSCRIBE counts once. For aioredis 1.x (used by aioredlock) every
  ``RedisConnection.execute`` call is one round trip (aioredis writes each command as it
  is issued).
* **Top-level commands** are counted on the client too, by command name, in what each
  ``send_packed_command`` writes (redis-py asyncio: the RESP arrays are parsed, so
  libraries that pack their own commands are counted alike), at ``send_command`` /
  ``pack_commands`` (redis-py sync) or ``execute`` (aioredis). These are the commands the
  client sends: EVALSHA, SET, PUBLISH, ...
* **All commands** come from the server: the delta of ``INFO commandstats``
  (``calls + rejected_calls``) over the measured window. Redis counts every command a
  Lua script runs with ``redis.call`` here as well, so ``all - top-level`` is the
  number of commands run inside scripts. The harness's own INFO / CLIENT LIST calls are
  tallied and subtracted exactly.
* **Connections** come from ``CLIENT LIST``, excluding the harness's own connection
  (named ``bench-admin``).
* **Server time** comes from the ``usec`` of ``INFO commandstats``. A script's EVALSHA
  time includes the commands it runs with ``redis.call``, and Redis *also* adds those to
  their own ``cmdstat_*``: summing every command would count them twice. So the server
  time of what a client sent is the ``usec`` of the command names the client sent (each
  name's time scaled by its top-level share of the calls, for a name that runs both at top
  level and inside scripts). See :func:`sent_usec`.
* **Server CPU** is ``used_cpu_user + used_cpu_sys`` of ``INFO cpu`` (``getrusage`` of
  the server process: command execution plus reading, parsing and writing on sockets,
  event loop, pub/sub delivery, background cron).
"""

from __future__ import annotations

import importlib
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection

ADMIN_NAME = "bench-admin"


# -- client-side counters -------------------------------------------------------------


@dataclass
class ClientCounts:
    """What a client sent: socket writes (round trips) and top-level commands by name."""

    round_trips: int = 0
    commands: Counter[str] = field(default_factory=Counter)
    #: payloads written but not yet parsed for their command names: parsing them as they
    #: are written cost ~25 µs per cycle inside the timed window, for every library
    pending: list[bytes] = field(default_factory=list)

    def settle(self) -> None:
        """Count the command names of the payloads written since the last settle."""
        pending, self.pending = self.pending, []
        for payload in pending:
            self.commands.update(resp_command_names(payload))

    def copy(self) -> ClientCounts:
        self.settle()
        return ClientCounts(self.round_trips, Counter(self.commands))

    def minus(self, earlier: ClientCounts) -> ClientCounts:
        self.settle()
        diff = Counter(self.commands)
        diff.subtract(earlier.commands)
        return ClientCounts(self.round_trips - earlier.round_trips, +diff)

    @property
    def total_commands(self) -> int:
        return sum(self.commands.values())

    def to_json(self) -> dict[str, Any]:
        return {"round_trips": self.round_trips, "commands": dict(self.commands)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClientCounts:
        return cls(
            int(data["round_trips"]), Counter({str(k): int(v) for k, v in data["commands"].items()})
        )

    def add(self, other: ClientCounts) -> None:
        self.round_trips += other.round_trips
        self.commands.update(other.commands)


#: The process-wide counters every instrumented connection adds to.
COUNTS = ClientCounts()
_SYNC_GUARD = threading.Lock()

_CONTAINER_COMMANDS = frozenset(
    {"client", "config", "script", "function", "command", "memory", "object", "xinfo",
     "cluster", "acl", "latency", "module", "pubsub", "slowlog", "debug"}
)  # fmt: skip


def command_name(args: Sequence[object]) -> str:
    """The commandstats-style name of a command (``evalsha``, ``client|setinfo``)."""
    if not args:
        return "?"
    parts: list[str] = []
    for arg in args[:2]:
        if isinstance(arg, (bytes, bytearray, memoryview)):
            parts.extend(bytes(arg).decode("ascii", "replace").split())
        else:
            parts.extend(str(arg).split())
    if not parts:
        return "?"
    head = parts[0].lower()
    if head in _CONTAINER_COMMANDS and len(parts) > 1:
        return f"{head}|{parts[1].lower()}"
    return head


def _is_counted(conn: object) -> bool:
    return not getattr(conn, "bench_uncounted", False)


def install_client_counters() -> None:
    """Patch redis-py (asyncio and sync), aiolock's transport and, when importable, aioredis."""
    _patch_redis_py_async()
    _patch_redis_py_sync()
    _patch_aiolock()


def _patch_aiolock() -> None:
    """Count aiolock's writes at its transport, which writes to redis-py's connections
    itself (without send_packed_command) on its fast path."""
    _transport: Any
    try:
        from aiolock._redis import transport as _transport
    except ImportError:  # an aiolock without its own transport: redis-py's patch counts it
        return
    if getattr(_transport, "_bench_patched", False):
        return
    orig_write: Callable[..., Any] = _transport.write

    async def write(conn: Any, packed: bytes) -> None:
        if _is_counted(conn):
            COUNTS.round_trips += 1
            COUNTS.pending.append(packed)
        await orig_write(conn, packed)

    _transport.write = write
    _transport._bench_patched = True


def _patch_redis_py_async() -> None:
    cls: Any = redis.asyncio.connection.AbstractConnection
    if getattr(cls, "_bench_patched", False):
        return
    orig_send: Callable[..., Any] = cls.send_packed_command

    async def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
        # Commands are counted in what is written, not at redis-py's pack_command: a
        # library may pack its own commands (aiolock does) and still use the connection.
        if _is_counted(self):
            COUNTS.round_trips += 1
            COUNTS.pending.append(command if isinstance(command, bytes) else _join(command))
        await orig_send(self, command, check_health)

    # Still "redis-py's own" to aiolock's transport, so that it keeps its fast write path
    # (counted by _patch_aiolock) instead of falling back to this one.
    send_packed_command.__module__ = orig_send.__module__
    cls.send_packed_command = send_packed_command
    cls._bench_patched = True


def _join(command: Any) -> bytes:
    if isinstance(command, str):
        return command.encode()
    if isinstance(command, (bytearray, memoryview)):
        return bytes(command)
    return b"".join(bytes(chunk) for chunk in command)


def resp_command_names(payload: bytes | str | Iterable[bytes]) -> list[str]:
    """The command names in a RESP payload of arrays of bulk strings (what clients send)."""
    if isinstance(payload, str):
        data = payload.encode()
    elif isinstance(payload, (bytes, bytearray, memoryview)):
        data = bytes(payload)
    else:
        data = b"".join(bytes(chunk) for chunk in payload)
    names: list[str] = []
    pos = 0
    while pos < len(data) and data[pos : pos + 1] == b"*":
        end = data.index(b"\r\n", pos)
        count = int(data[pos + 1 : end])
        pos = end + 2
        args: list[bytes] = []
        for _ in range(count):
            end = data.index(b"\r\n", pos)
            size = int(data[pos + 1 : end])
            if len(args) < 2:
                args.append(data[end + 2 : end + 2 + size])
            pos = end + 2 + size + 2
        names.append(command_name([a.decode("utf-8", "replace") for a in args]))
    return names


def _patch_redis_py_sync() -> None:
    # The sync connection packs through a packer object, not pack_command: count names
    # at send_command (single commands) and pack_commands (pipelines).
    cls: Any = redis.connection.AbstractConnection
    if getattr(cls, "_bench_patched", False):
        return
    orig_send: Callable[..., Any] = cls.send_packed_command
    orig_command: Callable[..., Any] = cls.send_command
    orig_pack_many: Callable[..., Any] = cls.pack_commands

    def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
        if _is_counted(self):
            with _SYNC_GUARD:
                COUNTS.round_trips += 1
        orig_send(self, command, check_health)

    def send_command(self: Any, *args: Any, **kwargs: Any) -> None:
        if _is_counted(self):
            name = command_name(args)
            with _SYNC_GUARD:
                COUNTS.commands[name] += 1
        orig_command(self, *args, **kwargs)

    def pack_commands(self: Any, commands: Iterable[Sequence[Any]]) -> Any:
        commands = list(commands)
        if _is_counted(self):
            names = [command_name(c) for c in commands]
            with _SYNC_GUARD:
                COUNTS.commands.update(names)
        return orig_pack_many(self, commands)

    cls.send_packed_command = send_packed_command
    cls.send_command = send_command
    cls.pack_commands = pack_commands
    cls._bench_patched = True


def install_aioredis_counters() -> None:
    """Patch aioredis 1.x ``RedisConnection.execute`` (and pub/sub execute)."""
    module: Any = importlib.import_module("aioredis.connection")
    cls: Any = module.RedisConnection
    if getattr(cls, "_bench_patched", False):
        return
    orig_execute: Callable[..., Any] = cls.execute
    orig_pubsub: Callable[..., Any] = cls.execute_pubsub

    def execute(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        COUNTS.round_trips += 1
        COUNTS.commands[command_name([command, *args[:1]])] += 1
        return orig_execute(self, command, *args, **kwargs)

    def execute_pubsub(self: Any, command: Any, *channels: Any) -> Any:
        COUNTS.round_trips += 1
        COUNTS.commands[command_name([command])] += 1
        return orig_pubsub(self, command, *channels)

    cls.execute = execute
    cls.execute_pubsub = execute_pubsub
    cls._bench_patched = True


# -- server-side: commandstats, client list ------------------------------------------


class _AdminConnection(redis.asyncio.connection.Connection):
    """A connection the client-side counters ignore."""

    bench_uncounted = True


@dataclass(frozen=True)
class ServerSnapshot:
    calls: dict[str, int]
    admin_tally: dict[str, int]
    #: ``usec`` by command name (INFO commandstats)
    usec: dict[str, int] = field(default_factory=dict)
    #: ``used_cpu_user + used_cpu_sys`` (INFO cpu), seconds
    cpu_s: float = 0.0


@dataclass(frozen=True)
class KeyInfo:
    """One key left in Redis: its name, ``MEMORY USAGE`` (bytes), ``PTTL`` (ms), type."""

    key: str
    bytes: int
    pttl_ms: int
    kind: str


class Admin:
    """The harness's own connection to the server: stats, CLIENT LIST, DBSIZE."""

    def __init__(self, url: str) -> None:
        pool = redis.asyncio.ConnectionPool.from_url(
            url, connection_class=_AdminConnection, client_name=ADMIN_NAME
        )
        self._client = redis.asyncio.Redis(connection_pool=pool)
        self._tally: Counter[str] = Counter()

    async def close(self) -> None:
        await self._client.aclose()

    async def ping(self) -> None:
        await self._client.ping()

    async def snapshot(self) -> ServerSnapshot:
        tally = dict(self._tally)
        self._tally["info"] += 1
        # One INFO for both sections (Redis >= 7 takes several): its own time and CPU show
        # up in the *next* snapshot, as an `info` call the tally removes (time) or as a
        # few tens of microseconds of server CPU per snapshot (not removed).
        info: dict[str, Any] = await self._client.info("commandstats", "cpu")
        return ServerSnapshot(
            parse_commandstats(info), tally, parse_commandstats(info, "usec"), server_cpu_s(info)
        )

    async def keys_matching(self, match: str, limit: int = 100_000) -> list[KeyInfo]:
        """Every key matching *match* (SCAN, at most *limit*), with its memory and TTL;
        keys that expire while being looked at are left out."""
        keys: list[str] = []
        cursor = 0
        for _ in range(100_000):  # bounded; the cursor returns to 0 long before
            self._tally["scan"] += 1
            cursor, batch = await self._client.scan(cursor, match=match, count=1000)
            keys.extend(k.decode() if isinstance(k, bytes) else str(k) for k in batch)
            if cursor == 0 or len(keys) >= limit:
                break
        keys = sorted(set(keys))[:limit]
        out: list[KeyInfo] = []
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            pipe = self._client.pipeline(transaction=False)
            for key in chunk:
                pipe.memory_usage(key, samples=0)
                pipe.pttl(key)
                pipe.type(key)
            self._tally["memory|usage"] += len(chunk)
            self._tally["pttl"] += len(chunk)
            self._tally["type"] += len(chunk)
            replies: list[Any] = await pipe.execute()
            for i, key in enumerate(chunk):
                size, pttl, kind = replies[3 * i : 3 * i + 3]
                if isinstance(kind, bytes):
                    kind = kind.decode()
                if int(pttl) == -2 or kind == "none":
                    continue  # expired (or deleted) between SCAN and now: not left
                out.append(KeyInfo(key, int(size or 0), int(pttl), str(kind)))
        return out

    async def connections(self) -> list[dict[str, Any]]:
        """Clients other than the harness's own (``CLIENT LIST``)."""
        self._tally["client|list"] += 1
        clients: list[dict[str, Any]] = await self._client.client_list()
        return [c for c in clients if c.get("name") != ADMIN_NAME]

    async def dbsize(self) -> int:
        self._tally["dbsize"] += 1
        return int(await self._client.dbsize())


def parse_commandstats(info: dict[str, Any], field_name: str = "calls") -> dict[str, int]:
    """``calls + rejected_calls`` (or another field, e.g. ``usec``) by command name."""
    out: dict[str, int] = {}
    for key, value in info.items():
        if not key.startswith("cmdstat_") or not isinstance(value, dict):
            continue
        if field_name == "calls":
            n = int(value.get("calls", 0)) + int(value.get("rejected_calls", 0))
        else:
            n = int(value.get(field_name, 0))
        out[key[len("cmdstat_") :]] = n
    return out


def server_cpu_s(info: dict[str, Any]) -> float:
    """``used_cpu_user + used_cpu_sys`` of an INFO reply (0 when absent)."""
    return float(info.get("used_cpu_user", 0.0)) + float(info.get("used_cpu_sys", 0.0))


def server_delta(before: ServerSnapshot, after: ServerSnapshot) -> Counter[str]:
    """Commands the server ran between two snapshots, minus the harness's own."""
    delta: Counter[str] = Counter()
    for name, calls in after.calls.items():
        delta[name] = calls - before.calls.get(name, 0)
    for name, n in after.admin_tally.items():
        delta[name] -= n - before.admin_tally.get(name, 0)
    return +delta


def usec_delta(before: ServerSnapshot, after: ServerSnapshot, calls: Counter[str]) -> Counter[str]:
    """Server time (``usec``) between two snapshots, by command name, for the names in
    *calls* (a :func:`server_delta`: the harness's own commands are not in it)."""
    out: Counter[str] = Counter()
    for name in calls:
        out[name] = after.usec.get(name, 0) - before.usec.get(name, 0)
    return +out


def sent_usec(usec: Counter[str], calls: Counter[str], sent: Counter[str]) -> float:
    """Server time of the commands a client *sent*, scripts' inner commands included.

    *usec* and *calls* are server deltas by name, *sent* the client's top-level commands
    by name. A script's time already includes what it runs with ``redis.call``, which
    Redis also adds to those commands' own stats, so only the sent names count; a name
    that also ran inside scripts counts in proportion to its top-level calls.
    """
    total = 0.0
    for name, n_sent in sent.items():
        n_all = calls.get(name, 0)
        if n_all > 0 and n_sent > 0:
            total += usec.get(name, 0) * min(1.0, n_sent / n_all)
    return total


def sub_count(clients: Iterable[dict[str, Any]]) -> int:
    """Connections in pub/sub mode among *clients*."""
    n = 0
    for c in clients:
        subs = sum(int(c.get(k, 0) or 0) for k in ("sub", "psub", "ssub"))
        if subs > 0:
            n += 1
    return n


# -- latency and memory ---------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (*q* in 0..100) of already sorted values."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac)


def latency_summary(samples_s: Iterable[float], prefix: str) -> dict[str, float | int]:
    """p50/p90/p99/max in microseconds and the sample count."""
    values = sorted(samples_s)
    return {
        f"{prefix}_n": len(values),
        f"{prefix}_p50_us": percentile(values, 50) * 1e6,
        f"{prefix}_p90_us": percentile(values, 90) * 1e6,
        f"{prefix}_p99_us": percentile(values, 99) * 1e6,
        f"{prefix}_max_us": (values[-1] * 1e6) if values else math.nan,
    }


def quantile_sample(samples_s: Iterable[float], k: int = 1000) -> list[float]:
    """*k* evenly spaced quantiles of the samples, in microseconds (for plots)."""
    values = sorted(samples_s)
    if len(values) <= k:
        return [v * 1e6 for v in values]
    return [percentile(values, 100.0 * i / (k - 1)) * 1e6 for i in range(k)]


def rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            pages = int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    import os

    return pages * os.sysconf("SC_PAGE_SIZE")
