"""Read-only inspection of the locks under a prefix: what the ``aiolock`` command shows.

Everything here reads; nothing writes. The key layout it parses is the wire format of
:mod:`aiolock._keys` and of each kind (:mod:`aiolock._kinds`): for a prefix ``P``,

====================  ===========================================================
``P:lock:{T}``        plain lock: hash ``<owner field>`` -> hold count
``P:fair:{T}``        fair lock: the same hash, with ``:queue`` (waiters, a zset)
``P:rw:{T}``          read-write lock: hash of holds plus ``writer``, ``writer_owner``
                      and ``writer_attempt``; ``:leases`` and ``:claims`` zsets
``P:sem:{T}``         semaphore: hash ``<permit field>`` -> permits plus ``#held``;
                      ``:expiry``, ``:claims``, ``:wants`` and ``:limit``
====================  ===========================================================

``T`` is the hash tag of the name (the name, or ``~`` + name when the name starts with
``}`` or ``~``). Helper keys (``:fence``, ``:rel:*``, ``:void:*``) are not lock objects.
Keys are found with ``SCAN`` (never ``KEYS``, which blocks the server on a large database).

Every holder and waiter field starts with the id of its manager, whose identity record
``P:mgr:{<manager id>}`` (:mod:`aiolock._identity`) says which host, process and
application it is: :func:`scan` and :func:`describe` read those records (one ``MGET``)
and fill in :class:`Holder`'s ``host``, ``pid`` and ``name`` (None when the record is
gone: the process died, or its manager runs with ``identity=False``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from redis.asyncio import Redis

from ._identity import manager_of, parse_record
from ._keys import ESCAPE, hash_tag, identity_key, split_key

__all__ = [
    "KINDS",
    "Holder",
    "LockInfo",
    "Who",
    "describe",
    "glob_escape",
    "lock_key",
    "parse_key",
    "scan",
]

#: The kinds, as the CLI names them, with the tag each puts in its keys.
KINDS: dict[str, str] = {"lock": "lock", "fair": "fair", "rw": "rw", "semaphore": "sem"}
#: How a table names each kind.
LABELS: dict[str, str] = {
    "lock": "lock",
    "fair": "fair lock",
    "rw": "rw lock",
    "semaphore": "semaphore",
}
_BY_TAG = {tag: kind for kind, tag in KINDS.items()}

#: Suffixes of keys whose presence means the object exists (its own structure, or a
#: part that outlives it: a semaphore's limit, a queue of waiters). Others are helpers.
_OBJECT_SUFFIXES: dict[str, frozenset[str]] = {
    "lock": frozenset({""}),
    "fair": frozenset({"", ":queue", ":claims"}),
    "rw": frozenset({"", ":leases", ":claims"}),
    "semaphore": frozenset({"", ":expiry", ":claims", ":wants", ":limit"}),
}

#: The rw hash's metadata fields, which are not holds.
_RW_META = frozenset({"writer", "writer_owner", "writer_attempt"})
#: The semaphore hash's running total, not a permit field.
_SEM_TOTAL = "#held"


@dataclass(frozen=True)
class Holder:
    """One holder of a lock object: its owner field and its hold count (or permits),
    and who it is, from its manager's identity record (None where there is none)."""

    owner: str
    #: hold count (lock, fair, rw) or permits (semaphore)
    count: int
    #: "writer" or "reader" for a read-write lock, "" otherwise
    role: str = ""
    #: the holder's manager id (the owner field's first part)
    manager: str | None = None
    host: str | None = None
    pid: int | None = None
    #: the application name of the manager (``name=``), else its process name
    name: str | None = None
    #: the process name
    process: str | None = None
    #: when the holder's manager opened (Unix time, its own clock)
    started: float | None = None
    #: seconds this hold has lasted, where Redis knows (a ``contrib.jobs`` lock's holder
    #: record); None otherwise: a plain hold's start is kept nowhere in Redis
    held_for: float | None = None
    #: seconds left on this hold's lease (the object's PTTL, or the hold's own lease end
    #: for a read-write lock and a semaphore)
    lease_left: float | None = None


@dataclass(frozen=True)
class Who:
    """A waiting field and who it is (from its manager's identity record)."""

    field: str
    manager: str | None = None
    host: str | None = None
    pid: int | None = None
    name: str | None = None


@dataclass(frozen=True)
class LockInfo:
    """What Redis says about one lock object right now."""

    #: "lock", "fair", "rw" or "semaphore" (see :data:`KINDS`)
    kind: str
    name: str
    #: the object's own key (its hash)
    key: str
    holders: tuple[Holder, ...] = ()
    #: seconds until the object's key expires; None when it has no expiry or is absent
    ttl: float | None = None
    #: fair-queue length, rw writer claims or semaphore claims; 0 for a plain lock
    waiters: int = 0
    #: subscribers of the object's release channel (``PUBSUB NUMSUB``)
    listeners: int = 0
    #: a semaphore's stored limit
    limit: int | None = None
    #: a semaphore's permits held in total
    held: int | None = None
    #: the waiting fields, in order (fair queue, rw claims, semaphore claims)
    waiting: tuple[str, ...] = field(default=())
    #: the same, each with who it is
    waiting_who: tuple[Who, ...] = field(default=())
    #: a ``contrib.jobs`` lock's holder record (job id, host, pid, since), read by
    #: :func:`describe` only
    job: dict[str, Any] | None = None
    #: the last fencing token released (``<key>:fence``, kept ``fence_ttl``), read by
    #: :func:`describe` only; None when none is kept
    fence: int | None = None

    @property
    def label(self) -> str:
        """The kind as a table shows it ("fair lock", "rw lock", ...)."""
        return LABELS[self.kind]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (holders as dicts, tuples as lists)."""
        data = asdict(self)
        data["holders"] = [asdict(holder) for holder in self.holders]
        data["waiting"] = list(self.waiting)
        data["waiting_who"] = [asdict(who) for who in self.waiting_who]
        return data


def glob_escape(text: str) -> str:
    """*text* with the characters special to Redis glob patterns escaped."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def lock_key(prefix: str, kind: str, name: str) -> str:
    """The own key of the object *name* of *kind* under *prefix*."""
    return f"{prefix}:{KINDS[kind]}:{{{hash_tag(name)}}}"


def parse_key(prefix: str, key: str) -> tuple[str, str, str] | None:
    """``(kind, name, suffix)`` of an aiolock key under *prefix*, or None if it is not one.

    The suffix is what follows the closing brace (``""`` for an object's own hash,
    ``":queue"``, ``":released"``, ...). The key's prefix and tag are read as
    :func:`aiolock._keys.split_key` reads them, so a key of a longer prefix that starts
    with *prefix* (``P:sem:lock:{x}`` under ``P``) is not taken for one of *prefix*. The
    hash tag runs to the LAST ``}`` of the key: no suffix contains one.
    """
    split = split_key(key)
    if split is None or split[0] != prefix or split[1] not in _BY_TAG:
        return None
    kind, body = _BY_TAG[split[1]], split[2]
    close = body.rfind("}")
    if close <= 1:
        return None
    tag_text, suffix = body[1:close], body[close + 1 :]
    if suffix and not suffix.startswith(":"):
        return None
    name = tag_text[len(ESCAPE) :] if tag_text.startswith(ESCAPE) else tag_text
    return kind, name, suffix


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _int(value: Any) -> int:
    try:
        return int(_text(value))
    except ValueError:
        return 0


async def scan(redis: Redis, prefix: str) -> list[LockInfo]:
    """Every lock object under *prefix*, sorted by name then kind (SCAN, then reads)."""
    found: set[tuple[str, str]] = set()
    async for raw in redis.scan_iter(match=f"{glob_escape(prefix)}:*", count=500):
        parsed = parse_key(prefix, _text(raw))
        if parsed is None:
            continue
        kind, name, suffix = parsed
        if suffix in _OBJECT_SUFFIXES[kind]:
            found.add((kind, name))
    order = list(KINDS)
    objects = sorted(found, key=lambda item: (item[1], order.index(item[0])))
    infos = [await _read(redis, prefix, kind, name) for kind, name in objects]
    return await resolve(redis, prefix, infos)


async def describe(redis: Redis, prefix: str, name: str) -> list[LockInfo]:
    """Every kind of object that exists under *name* (none: an empty list), with its
    fence state and the holder record of a ``contrib.jobs`` lock."""
    infos = []
    for kind in KINDS:
        key = lock_key(prefix, kind, name)
        parts = [key + suffix for suffix in _OBJECT_SUFFIXES[kind]]
        if await redis.exists(*parts):
            info = await _read(redis, prefix, kind, name)
            fence = await redis.get(f"{info.key}:fence")
            if fence is not None:
                info = replace(info, fence=_int(fence))
            if kind == "lock":
                info = await _with_job(redis, info)
            infos.append(info)
    return await resolve(redis, prefix, infos)


async def _with_job(redis: Redis, info: LockInfo) -> LockInfo:
    """*info* with the holder record ``contrib.jobs`` keeps at ``<lock key>:job``, and
    the hold's age from it (the record's fencing token is the server's time in
    microseconds when the lock was taken; else its ``since``, the holder's clock)."""
    job = parse_record(await redis.get(f"{info.key}:job"))
    if job is None or not info.holders:
        return info
    token = job.get("token")
    if isinstance(token, int) and token > 0:
        seconds, micros = await redis.time()
        held_for: float | None = seconds + micros / 1e6 - token / 1e6
    elif isinstance(job.get("since"), (int, float)):
        held_for = time.time() - float(job["since"])
    else:
        held_for = None
    holders = info.holders
    if held_for is not None and len(holders) == 1:
        holders = (replace(holders[0], held_for=round(max(0.0, held_for), 3)),)
    return replace(info, job=job, holders=holders)


async def resolve(redis: Redis, prefix: str, infos: list[LockInfo]) -> list[LockInfo]:
    """*infos* with every holder and waiter resolved to its manager's identity record
    (one ``MGET`` for all of them)."""
    ids = sorted(_managers(infos))
    if not ids:
        return infos
    raws = await redis.mget([identity_key(prefix, manager) for manager in ids])
    records = {manager: parse_record(raw) for manager, raw in zip(ids, raws, strict=True)}
    return [_resolved(info, records) for info in infos]


def _managers(infos: Iterable[LockInfo]) -> set[str]:
    found = set()
    for info in infos:
        for text in (*(holder.owner for holder in info.holders), *info.waiting):
            manager = manager_of(text)
            if manager is not None:
                found.add(manager)
    return found


def _who(text: str, records: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """The identity fields of the field *text*: all None when its record is gone."""
    manager = manager_of(text)
    record = records.get(manager) if manager is not None else None
    if record is None:
        return {"manager": manager, "host": None, "pid": None, "name": None}
    pid = record.get("p")
    return {
        "manager": manager,
        "host": _opt_text(record.get("h")),
        "pid": pid if isinstance(pid, int) else None,
        "name": _opt_text(record.get("n")) or _opt_text(record.get("c")),
    }


def _resolved(info: LockInfo, records: dict[str, dict[str, Any] | None]) -> LockInfo:
    holders = []
    for holder in info.holders:
        who = _who(holder.owner, records)
        record = records.get(who["manager"] or "")
        extra: dict[str, Any] = {}
        if record is not None:
            started = record.get("t")
            extra["process"] = _opt_text(record.get("c"))
            extra["started"] = float(started) if isinstance(started, (int, float)) else None
        holders.append(replace(holder, **who, **extra))
    waiting = tuple(Who(text, **_who(text, records)) for text in info.waiting)
    return replace(info, holders=tuple(holders), waiting_who=waiting)


def _opt_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


async def _ttl(redis: Redis, key: str) -> float | None:
    millis = await redis.pttl(key)
    return None if millis < 0 else millis / 1000


async def _listeners(redis: Redis, key: str) -> int:
    channel = f"{key}:released"
    reply = await redis.pubsub_numsub(channel)
    return int(reply[0][1]) if reply else 0


async def _zmembers(redis: Redis, key: str) -> tuple[str, ...]:
    return tuple(_text(member) for member in await redis.zrange(key, 0, -1))


async def _lease_ends(redis: Redis, key: str) -> dict[str, float]:
    """Seconds left per field of a zset of lease ends (server milliseconds)."""
    ends: list[Any] = await redis.zrange(key, 0, -1, withscores=True)
    if not ends:
        return {}
    seconds, micros = await redis.time()
    now_ms = seconds * 1000 + micros / 1000
    return {_text(pair[0]): round(max(0.0, (float(pair[1]) - now_ms) / 1000), 3) for pair in ends}


async def _read(redis: Redis, prefix: str, kind: str, name: str) -> LockInfo:
    key = lock_key(prefix, kind, name)
    key_type = _text(await redis.type(key))
    raw = await redis.hgetall(key) if key_type == "hash" else {}
    fields = {_text(k): _text(v) for k, v in raw.items()}
    common: dict[str, Any] = {
        "kind": kind,
        "name": name,
        "key": key,
        "ttl": await _ttl(redis, key),
        "listeners": await _listeners(redis, key),
    }
    ttl = common["ttl"]
    if kind == "lock":
        holders = tuple(
            Holder(owner, _int(count), lease_left=ttl) for owner, count in sorted(fields.items())
        )
        return LockInfo(holders=holders, **common)
    if kind == "fair":
        holders = tuple(
            Holder(owner, _int(count), lease_left=ttl) for owner, count in sorted(fields.items())
        )
        waiting = await _zmembers(redis, f"{key}:queue")
        return LockInfo(holders=holders, waiters=len(waiting), waiting=waiting, **common)
    if kind == "rw":
        writer = fields.get("writer")
        ends = await _lease_ends(redis, f"{key}:leases")
        holders = tuple(
            Holder(
                owner,
                _int(count),
                "writer" if owner == writer else "reader",
                lease_left=ends.get(owner, ttl),
            )
            for owner, count in sorted(fields.items())
            if owner not in _RW_META
        )
        waiting = await _zmembers(redis, f"{key}:claims")
        return LockInfo(holders=holders, waiters=len(waiting), waiting=waiting, **common)
    # semaphore
    ends = await _lease_ends(redis, f"{key}:expiry")
    holders = tuple(
        Holder(owner, _int(permits), lease_left=ends.get(owner, ttl))
        for owner, permits in sorted(fields.items())
        if owner != _SEM_TOTAL
    )
    waiting = await _zmembers(redis, f"{key}:claims")
    limit_raw = await redis.get(f"{key}:limit")
    limit = None if limit_raw is None else _int(limit_raw)
    if common["ttl"] is None and holders:
        common["ttl"] = await _ttl(redis, f"{key}:expiry")
    return LockInfo(
        holders=holders,
        waiters=len(waiting),
        waiting=waiting,
        limit=limit,
        held=_int(fields.get(_SEM_TOTAL, "0")),
        **common,
    )
