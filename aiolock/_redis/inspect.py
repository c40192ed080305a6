"""Read-only inspection of the locks under a prefix: what the ``aiolock`` command shows.

Everything here reads; nothing writes. The key layout it parses is the wire format of
:mod:`aiolock._keys` and of each kind (:mod:`aiolock._kinds`): for a prefix ``P``,

====================  ===========================================================
``P:lock:{T}``        plain lock: one string, ``<owner field>|<count>|<token>|<epoch>|
                      <waiter flag>`` while held, ``|<epoch>|<last token>`` while free;
                      ``:listeners`` (a zset: manager id -> expiry, server ms) names
                      the managers whose waiters listen for its release
``P:fair:{T}``        fair lock: the same hash, with ``:queue`` (waiters, a zset)
``P:rw:{T}``          read-write lock: hash of holds plus ``writer``, ``writer_owner``
                      and ``writer_attempt``; ``:leases`` and ``:claims`` zsets
``P:sem:{T}``         semaphore: hash ``<permit field>`` -> permits plus ``#held``;
                      ``:expiry``, ``:claims``, ``:wants`` and ``:limit``
``P:redlock:{T}``     a Redlock as one of its masters has it: a string, the token
                      ``<manager id>:<number>`` of the hold (the other masters are
                      not read: point the command at each to compare)
====================  ===========================================================

``T`` is the hash tag of the name (the name, or ``~`` + name when the name starts with
``}`` or ``~``). Helper keys (``:fence``, ``:rel:*``, ``:void:*``) are not lock objects.
Keys are found with ``SCAN`` (never ``KEYS``, which blocks the server on a large database).
A plain lock's free state (kept after its last release for the fence and for resent
releases) is not a lock object: it is read and left out.

Every holder and waiter field starts with the id of its manager, whose identity record
``P:mgr:{<manager id>}`` (:mod:`aiolock._redis.identity`) says which host, process and
application it is: :func:`scan` and :func:`describe` read those records (one ``MGET``)
and fill in :class:`Holder`'s ``host``, ``pid``, ``name`` and ``layout`` (None when the
record is gone: the process died, or its manager runs with ``identity=False``).

A plain lock's holder also gets its fencing token (the state's ``<token>``, what its
handle's ``fencing_token`` reads) and ``held_for``, the server's ``TIME`` (the first
command of the same pipeline as the state) less that token: tokens are the server's
clock in microseconds at the grant, or forced above it, so the figure is a lower bound
of the hold's age. The other kinds keep no token and no start per hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from redis.asyncio import Redis

from aiolock._keys import ESCAPE, KIND_LABELS, KIND_TAGS, hash_tag, identity_key, split_key
from aiolock._redis.identity import layout_of, manager_of, parse_record
from aiolock._redis.lock_state import parse_state

__all__ = [
    "KINDS",
    "Holder",
    "LockInfo",
    "Who",
    "describe",
    "find_objects",
    "glob_escape",
    "lock_key",
    "parse_key",
    "read_objects",
    "resolve",
    "scan",
    "sort_objects",
]

#: The kinds, as the CLI names them, with the tag each puts in its keys (the table of
#: :mod:`aiolock._keys`).
KINDS: dict[str, str] = KIND_TAGS
#: How a table names each kind.
LABELS: dict[str, str] = KIND_LABELS
_BY_TAG = {tag: kind for kind, tag in KINDS.items()}

#: Suffixes of keys whose presence means the object exists (its own structure, or a
#: part that outlives it: a semaphore's limit, a queue of waiters). Others are helpers.
_OBJECT_SUFFIXES: dict[str, frozenset[str]] = {
    "lock": frozenset({""}),
    "fair": frozenset({"", ":queue", ":claims"}),
    "rw": frozenset({"", ":leases", ":claims"}),
    "semaphore": frozenset({"", ":expiry", ":claims", ":wants", ":limit"}),
    "redlock": frozenset({""}),
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
    #: the key layout the manager announces (:data:`aiolock._keys.LAYOUT`; 1 for a record
    #: written before the field existed)
    layout: int | None = None
    #: the process name
    process: str | None = None
    #: when the holder's manager opened (Unix time, its own clock)
    started: float | None = None
    #: the hold's fencing token, what its handle's ``fencing_token`` reads: a plain
    #: lock's, from its state; None for the kinds whose structure keeps no token per
    #: hold (fair, rw, semaphore: only the fence key's last one) and for a Redlock (no
    #: fencing tokens)
    token: int | None = None
    #: a lower bound of the seconds this hold has lasted, on the server's clock: a plain
    #: lock's, the server's ``TIME`` (read before the state, in the same round trip) less
    #: its token (the server's clock in microseconds at the grant, or forced above it);
    #: 0 when the token is above that clock. None for the other kinds, whose structure
    #: keeps no start of a hold
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
    layout: int | None = None


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
    #: a plain lock's registered listeners: the managers with a task waiting for it
    #: (``<key>:listeners``, see aiolock._engine.listeners), each with who it is
    listening: tuple[Who, ...] = field(default=())
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
    #: the last fencing token released: the other kinds' ``<key>:fence``, kept
    #: ``fence_ttl``, read by :func:`describe` only; None when none is kept, and for a
    #: plain lock (its held state keeps the holder's token only)
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
        data["listening"] = [asdict(who) for who in self.listening]
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


#: lock objects read per pipeline (one round trip per batch, not per object)
BATCH = 200


async def scan(
    redis: Redis, prefix: str, *, sharded: bool = False, identities: Any = None
) -> list[LockInfo]:
    """Every lock object under *prefix*, sorted by name then kind (SCAN, then pipelined
    reads: one round trip per :data:`BATCH` objects).

    *redis* is a single server, or one primary of a Redis Cluster (each object's keys
    share one slot, so one node has all of them): then *sharded* counts listeners with
    ``PUBSUB SHARDNUMSUB``, and *identities* (the ``RedisCluster``) reads the identity
    records, which live in other slots; None: no identity records are read.
    """
    infos = await read_objects(redis, prefix, await find_objects(redis, prefix), sharded)
    return await resolve(redis if identities is None else identities, prefix, infos)


async def find_objects(redis: Redis, prefix: str) -> list[tuple[str, str]]:
    """``(kind, name)`` of every lock object under *prefix* (SCAN, never KEYS), sorted."""
    found: set[tuple[str, str]] = set()
    async for raw in redis.scan_iter(match=f"{glob_escape(prefix)}:*", count=500):
        parsed = parse_key(prefix, _text(raw))
        if parsed is None:
            continue
        kind, name, suffix = parsed
        if suffix in _OBJECT_SUFFIXES[kind]:
            found.add((kind, name))
    return sort_objects(found)


def sort_objects(objects: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """*objects* by name, then kind in :data:`KINDS` order."""
    order = list(KINDS)
    return sorted(objects, key=lambda item: (item[1], order.index(item[0])))


async def describe(
    redis: Redis, prefix: str, name: str, *, sharded: bool = False, identities: Any = None
) -> list[LockInfo]:
    """Every kind of object that exists under *name* (none: an empty list), with its
    fence state and the holder record of a ``contrib.jobs`` lock. *redis* is a single
    server or the cluster primary that owns the name's slot (see :func:`scan`)."""
    async with redis.pipeline(transaction=False) as pipe:
        for kind in KINDS:
            key = lock_key(prefix, kind, name)
            pipe.exists(*(key + suffix for suffix in _OBJECT_SUFFIXES[kind]))
        present = await pipe.execute()
    kinds = [kind for kind, count in zip(KINDS, present, strict=True) if count]
    infos = await read_objects(redis, prefix, [(kind, name) for kind in kinds], sharded)
    async with redis.pipeline(transaction=False) as pipe:
        for info in infos:
            pipe.get(f"{info.key}:fence")
        fences = await pipe.execute()
    described = []
    for read, kept in zip(infos, fences, strict=True):
        # a plain lock has no fence key, and its held state keeps no token released
        fence = None if read.kind == "lock" else kept
        info = read if fence is None else replace(read, fence=_int(fence))
        described.append(await _with_job(redis, info) if info.kind == "lock" else info)
    return await resolve(redis if identities is None else identities, prefix, described)


async def _with_job(redis: Redis, info: LockInfo) -> LockInfo:
    """*info* with the holder record ``contrib.jobs`` keeps at ``<lock key>:job``. The
    hold's age is its token's (:func:`_held_for`, the server's clock), not the record's
    ``since`` (the holder's clock, which the reader's clock need not agree with)."""
    job = parse_record(await redis.get(f"{info.key}:job"))
    if job is None or not info.holders:
        return info
    return replace(info, job=job)


async def resolve(redis: Any, prefix: str, infos: list[LockInfo]) -> list[LockInfo]:
    """*infos* with every holder and waiter resolved to its manager's identity record
    (one ``MGET`` for all of them)."""
    ids = sorted(_managers(infos))
    if not ids:
        return infos
    keys = [identity_key(prefix, manager) for manager in ids]
    # On a cluster the records live in many slots: MGET per slot (redis-py splits it)
    fetch = getattr(redis, "mget_nonatomic", None) or redis.mget
    raws = await fetch(keys)
    records = {manager: parse_record(raw) for manager, raw in zip(ids, raws, strict=True)}
    return [_resolved(info, records) for info in infos]


def _managers(infos: Iterable[LockInfo]) -> set[str]:
    found = set()
    for info in infos:
        listening = (who.field for who in info.listening)
        for text in (*(holder.owner for holder in info.holders), *info.waiting, *listening):
            manager = manager_of(text)
            if manager is not None:
                found.add(manager)
    return found


def _who(text: str, records: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """The identity fields of the field *text*: all None when its record is gone."""
    manager = manager_of(text)
    record = records.get(manager) if manager is not None else None
    if record is None:
        return {"manager": manager, "host": None, "pid": None, "name": None, "layout": None}
    pid = record.get("p")
    return {
        "manager": manager,
        "host": _opt_text(record.get("h")),
        "pid": pid if isinstance(pid, int) else None,
        "name": _opt_text(record.get("n")) or _opt_text(record.get("c")),
        "layout": layout_of(record),
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
    listening = tuple(Who(who.field, **_who(who.field, records)) for who in info.listening)
    return replace(info, holders=tuple(holders), waiting_who=waiting, listening=listening)


def _opt_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _ttl(millis: Any) -> float | None:
    return None if not isinstance(millis, int) or millis < 0 else millis / 1000


def _numsub(reply: Any) -> int:
    """The count of a ``PUBSUB NUMSUB``/``SHARDNUMSUB`` reply for one channel (parsed
    into pairs by redis-py, or the flat ``[channel, count]``)."""
    if isinstance(reply, list) and reply:
        first = reply[0]
        return _int(first[1] if isinstance(first, (list, tuple)) else reply[-1])
    return 0


def _members(reply: Any) -> tuple[str, ...]:
    return tuple(_text(member) for member in reply) if isinstance(reply, list) else ()


def _lease_ends(reply: Any, now_ms: float) -> dict[str, float]:
    """Seconds left per field of a zset of lease ends (server milliseconds)."""
    if not isinstance(reply, list):
        return {}
    return {_text(m): round(max(0.0, (float(score) - now_ms) / 1000), 3) for m, score in reply}


#: replies each kind's reads take after the common three (HGETALL or GET, PTTL, NUMSUB)
_EXTRA = {"lock": 1, "fair": 1, "rw": 2, "semaphore": 4, "redlock": 0}


def _queue_reads(pipe: Any, kind: str, key: str, sharded: bool) -> None:
    """Queue on *pipe* the reads of one object (parsed by :func:`_parse`)."""
    if kind in ("lock", "redlock"):
        pipe.get(key)  # the lock's whole state (a string); a Redlock holder's token
    else:
        pipe.hgetall(key)  # a key of another type answers an error, read as no holders
    pipe.pttl(key)
    pipe.execute_command("PUBSUB SHARDNUMSUB" if sharded else "PUBSUB NUMSUB", f"{key}:released")
    if kind == "lock":
        pipe.zrange(f"{key}:listeners", 0, -1, withscores=True)
    elif kind == "fair":
        pipe.zrange(f"{key}:queue", 0, -1)
    elif kind == "rw":
        pipe.zrange(f"{key}:leases", 0, -1, withscores=True)
        pipe.zrange(f"{key}:claims", 0, -1)
    elif kind == "semaphore":
        pipe.zrange(f"{key}:expiry", 0, -1, withscores=True)
        pipe.zrange(f"{key}:claims", 0, -1)
        pipe.get(f"{key}:limit")
        pipe.pttl(f"{key}:expiry")


async def read_objects(
    redis: Redis, prefix: str, objects: list[tuple[str, str]], sharded: bool = False
) -> list[LockInfo]:
    """What Redis says about each of *objects* (``(kind, name)``), in that order: one
    pipeline per :data:`BATCH` objects, which starts with the server's ``TIME``."""
    infos: list[LockInfo] = []
    for start in range(0, len(objects), BATCH):
        batch = objects[start : start + BATCH]
        async with redis.pipeline(transaction=False) as pipe:
            pipe.time()
            for kind, name in batch:
                _queue_reads(pipe, kind, lock_key(prefix, kind, name), sharded)
            replies = await pipe.execute(raise_on_error=False)
        seconds, micros = replies[0]
        now_ms = seconds * 1000 + micros / 1000
        at = 1
        for kind, name in batch:
            count = 3 + _EXTRA[kind]
            info = _parse(
                kind, name, lock_key(prefix, kind, name), replies[at : at + count], now_ms
            )
            at += count
            if info is not None:
                infos.append(info)
    return infos


def _parse(kind: str, name: str, key: str, replies: list[Any], now_ms: float) -> LockInfo | None:
    """The object read by :func:`_queue_reads`; None for a plain lock's free state (no
    object: the fence and the released tokens kept after the last release)."""
    raw, pttl, numsub, *extra = replies
    fields = {_text(k): _text(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    ttl = _ttl(pttl)
    common: dict[str, Any] = {"kind": kind, "name": name, "key": key, "ttl": ttl}
    common["listeners"] = _numsub(numsub)
    if kind == "redlock":  # one holder on this master: its token, count 1
        token = _text(raw) if isinstance(raw, (bytes, str)) else None
        return LockInfo(
            holders=() if token is None else (Holder(token, 1, lease_left=ttl),), **common
        )
    if kind == "lock":
        # registrations still live on the server's clock
        live = sorted(m for m, left in _lease_ends(extra[0], now_ms).items() if left > 0)
        common["listening"] = tuple(Who(manager) for manager in live)
        return _parse_lock(raw, common, now_ms)
    if kind == "fair":
        holders = tuple(
            Holder(owner, _int(count), lease_left=ttl) for owner, count in sorted(fields.items())
        )
        waiting = _members(extra[0])
        return LockInfo(holders=holders, waiters=len(waiting), waiting=waiting, **common)
    if kind == "rw":
        writer = fields.get("writer")
        ends = _lease_ends(extra[0], now_ms)
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
        waiting = _members(extra[1])
        return LockInfo(holders=holders, waiters=len(waiting), waiting=waiting, **common)
    # semaphore
    ends = _lease_ends(extra[0], now_ms)
    holders = tuple(
        Holder(owner, _int(permits), lease_left=ends.get(owner, ttl))
        for owner, permits in sorted(fields.items())
        if owner != _SEM_TOTAL
    )
    waiting = _members(extra[1])
    if common["ttl"] is None and holders:
        common["ttl"] = _ttl(extra[3])
    return LockInfo(
        holders=holders,
        waiters=len(waiting),
        waiting=waiting,
        limit=None if extra[2] is None else _int(extra[2]),
        held=_int(fields.get(_SEM_TOTAL, "0")),
        **common,
    )


def _parse_lock(raw: Any, common: dict[str, Any], now_ms: float) -> LockInfo | None:
    """A plain lock's state string (:mod:`aiolock._redis.lock_state`): held,
    ``<field>|<count>|<token>|<epoch>|<flag>``; free, ``|<epoch>|<last>`` (None: no
    object). A value aiolock did not write (or a key of another type, an error reply) is
    shown without holders, as the other kinds' foreign keys are. *now_ms* is the
    server's ``TIME``, read before the state."""
    if raw is None:  # gone between SCAN and GET
        return None
    state = parse_state(raw)  # None for an error reply too
    if state is None:
        return LockInfo(**common)
    if state.free:
        return None
    holder = Holder(
        state.field,
        state.holds,
        token=state.token,
        held_for=_held_for(state.token, now_ms),
        lease_left=common["ttl"],
    )
    # no fence: a held state keeps the holder's token, not the one released before it
    # (tokens follow the server's clock, so that one is not the holder's minus one)
    return LockInfo(holders=(holder,), **common)


def _held_for(token: int, now_ms: float) -> float:
    """Seconds from a plain lock's token to the server's *now_ms*: a lower bound of the
    hold's age. The acquire script takes the token from the server's ``TIME`` in
    microseconds, or the last token plus one where the clock is not above it (state.lua's
    ``next_token``): the token is never below the clock at the grant, and *now_ms* was
    read before the state, so the hold began at least this long ago (on that server's
    clock). A token above *now_ms* (forced above a clock that was behind, or a grant
    between the two reads) gives 0."""
    return round(max(0.0, (now_ms * 1000 - token) / 1_000_000), 3)
