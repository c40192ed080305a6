"""Read-only inspection of the locks under a prefix: what the ``aiolock`` command shows.

Everything here reads; nothing writes. What is generic lives here: finding the objects
under a prefix (``P:<tag>:{T}...``, the naming of :mod:`aiolock._keys`), the reads every
object takes (its own key, its PTTL, the subscribers of its release channel), the
identity records of the managers named, and :class:`LockInfo`. What a kind keeps in its
keys, and what those say, is the kind's: each kind describes its layout in a
:class:`Describer` (``aiolock/_kinds/<kind>/inspect.py``, Redlock's in
``aiolock/_redlock/inspect.py``), and the command passes their table, an
:class:`Inspected`, to the functions here (:mod:`aiolock._cli.inspect`). This layer may
import no kind, so the kinds come to it from above.

``T`` is the hash tag of the name (the name, or ``~`` + name when the name starts with
``}`` or ``~``). Helper keys (``:fence``, ``:rel:*``, ``:void:*``) are not lock objects.
Keys are found with ``SCAN`` (never ``KEYS``, which blocks the server on a large database).
A describer may find no object in what it read (a plain lock's free state, kept after
its last release for the fence and for resent releases): it is read and left out.

Every holder and waiter field starts with the id of its manager, whose identity record
``P:mgr:{<manager id>}`` (:mod:`aiolock._redis.identity`) says which host, process and
application it is: :func:`scan` and :func:`describe` read those records (one ``MGET``)
and fill in :class:`Holder`'s ``host``, ``pid``, ``name`` and ``layout`` (None when the
record is gone: the process died, or its manager runs with ``identity=False``).

Every pipeline of reads starts with the server's ``TIME``, which each describer gets
(``now_ms``): leases kept as ends on the server's clock, and the age of a plain lock's
hold, are reckoned from it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from redis.asyncio import Redis

from aiolock._keys import ESCAPE, KIND_LABELS, KIND_TAGS, hash_tag, identity_key, split_key
from aiolock._redis.identity import layout_of, manager_of, parse_record

__all__ = [
    "KINDS",
    "LABELS",
    "Describer",
    "Holder",
    "Inspected",
    "LockInfo",
    "Who",
    "describe",
    "find_objects",
    "glob_escape",
    "int_of",
    "lease_ends",
    "lock_key",
    "members_of",
    "parse_key",
    "read_objects",
    "resolve",
    "scan",
    "sort_objects",
    "text_of",
    "ttl_of",
]

#: The kinds, as the CLI names them, with the tag each puts in its keys (the table of
#: :mod:`aiolock._keys`).
KINDS: dict[str, str] = KIND_TAGS
#: How a table names each kind.
LABELS: dict[str, str] = KIND_LABELS
_BY_TAG = {tag: kind for kind, tag in KINDS.items()}


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


class Describer:
    """How the inspector reads the objects of one kind: which of its keys mean that an
    object exists, what to read beside the reads every object takes, and what the
    replies say. Each kind has one beside its kind (``aiolock/_kinds/<kind>/inspect.py``),
    listed in the command's table (:data:`aiolock._cli.inspect.DESCRIBERS`)."""

    #: the kind as the command names it: a key of :data:`aiolock._keys.KIND_TAGS`
    kind = ""
    #: suffixes of keys whose presence means the object exists (its own structure, or a
    #: part that outlives it: a semaphore's limit, a queue of waiters); others are helpers
    suffixes: frozenset[str] = frozenset({""})
    #: whether its own key is a string (read with GET), not a hash (HGETALL)
    string = False
    #: how many replies :meth:`queue` queues
    extra = 0
    #: whether :func:`describe` reads ``<key>:fence``, the last fencing token released
    fenced = True
    #: whether :func:`describe` reads ``<key>:job``, a ``contrib.jobs`` holder record
    jobs = False

    def queue(self, pipe: Any, key: str) -> None:
        """Queue on *pipe* the :attr:`extra` reads of the object *key*, after the common
        three (its own key, its PTTL, its release channel's subscribers)."""

    def parse(
        self, base: LockInfo, raw: Any, fields: dict[str, str], extra: list[Any], now_ms: float
    ) -> LockInfo | None:
        """The object *base* (kind, name, key, ttl and listeners filled in) as its replies
        say: *raw* is its own key's (GET's or HGETALL's, or an error), *fields* the same
        hash decoded (empty for a string), *extra* the replies of :meth:`queue`, *now_ms*
        the server's ``TIME`` read before them. None: no object (a free state)."""
        raise NotImplementedError


class Inspected:
    """The kinds the inspector reads, each with its :class:`Describer`, in the order of
    :data:`KINDS` (the command's order)."""

    __slots__ = ("by_kind",)

    def __init__(self, *describers: Describer) -> None:
        known = {describer.kind: describer for describer in describers}
        unknown = set(known) - set(KINDS)
        if unknown:  # pragma: no cover - a wiring mistake
            raise ValueError(f"no tag for {sorted(unknown)}: add them to aiolock._keys.KIND_TAGS")
        self.by_kind = {kind: known[kind] for kind in KINDS if kind in known}

    def __getitem__(self, kind: str) -> Describer:
        return self.by_kind[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_kind)


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


def text_of(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def int_of(value: Any) -> int:
    try:
        return int(text_of(value))
    except ValueError:
        return 0


#: lock objects read per pipeline (one round trip per batch, not per object)
BATCH = 200


async def scan(
    redis: Redis, prefix: str, kinds: Inspected, *, sharded: bool = False, identities: Any = None
) -> list[LockInfo]:
    """Every lock object of *kinds* under *prefix*, sorted by name then kind (SCAN, then
    pipelined reads: one round trip per :data:`BATCH` objects).

    *redis* is a single server, or one primary of a Redis Cluster (each object's keys
    share one slot, so one node has all of them): then *sharded* counts listeners with
    ``PUBSUB SHARDNUMSUB``, and *identities* (the ``RedisCluster``) reads the identity
    records, which live in other slots; None: no identity records are read.
    """
    found = await find_objects(redis, prefix, kinds)
    infos = await read_objects(redis, prefix, kinds, found, sharded)
    return await resolve(redis if identities is None else identities, prefix, infos)


async def find_objects(redis: Redis, prefix: str, kinds: Inspected) -> list[tuple[str, str]]:
    """``(kind, name)`` of every lock object of *kinds* under *prefix* (SCAN, never KEYS),
    sorted."""
    found: set[tuple[str, str]] = set()
    async for raw in redis.scan_iter(match=f"{glob_escape(prefix)}:*", count=500):
        parsed = parse_key(prefix, text_of(raw))
        if parsed is None:
            continue
        kind, name, suffix = parsed
        if kind in kinds.by_kind and suffix in kinds[kind].suffixes:
            found.add((kind, name))
    return sort_objects(found)


def sort_objects(objects: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """*objects* by name, then kind in :data:`KINDS` order."""
    order = list(KINDS)
    return sorted(objects, key=lambda item: (item[1], order.index(item[0])))


async def describe(
    redis: Redis,
    prefix: str,
    name: str,
    kinds: Inspected,
    *,
    sharded: bool = False,
    identities: Any = None,
) -> list[LockInfo]:
    """Every kind of object that exists under *name* (none: an empty list), with its
    fence state and the holder record of a ``contrib.jobs`` lock. *redis* is a single
    server or the cluster primary that owns the name's slot (see :func:`scan`)."""
    async with redis.pipeline(transaction=False) as pipe:
        for kind in kinds:
            key = lock_key(prefix, kind, name)
            pipe.exists(*(key + suffix for suffix in kinds[kind].suffixes))
        present = await pipe.execute()
    found = [(kind, name) for kind, count in zip(kinds, present, strict=True) if count]
    infos = await read_objects(redis, prefix, kinds, found, sharded)
    async with redis.pipeline(transaction=False) as pipe:
        for info in infos:
            pipe.get(f"{info.key}:fence")
        fences = await pipe.execute()
    described = []
    for read, kept in zip(infos, fences, strict=True):
        # a plain lock has no fence key, and its held state keeps no token released
        describer = kinds[read.kind]
        fence = kept if describer.fenced else None
        info = read if fence is None else replace(read, fence=int_of(fence))
        described.append(await _with_job(redis, info) if describer.jobs else info)
    return await resolve(redis if identities is None else identities, prefix, described)


async def _with_job(redis: Redis, info: LockInfo) -> LockInfo:
    """*info* with the holder record ``contrib.jobs`` keeps at ``<lock key>:job``. The
    hold's age is its token's (its describer reckons it on the server's clock), not the
    record's ``since`` (the holder's clock, which the reader's clock need not agree with)."""
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


def ttl_of(millis: Any) -> float | None:
    return None if not isinstance(millis, int) or millis < 0 else millis / 1000


def _numsub(reply: Any) -> int:
    """The count of a ``PUBSUB NUMSUB``/``SHARDNUMSUB`` reply for one channel (parsed
    into pairs by redis-py, or the flat ``[channel, count]``)."""
    if isinstance(reply, list) and reply:
        first = reply[0]
        return int_of(first[1] if isinstance(first, (list, tuple)) else reply[-1])
    return 0


def members_of(reply: Any) -> tuple[str, ...]:
    return tuple(text_of(member) for member in reply) if isinstance(reply, list) else ()


def lease_ends(reply: Any, now_ms: float) -> dict[str, float]:
    """Seconds left per field of a zset of lease ends (server milliseconds)."""
    if not isinstance(reply, list):
        return {}
    return {text_of(m): round(max(0.0, (float(score) - now_ms) / 1000), 3) for m, score in reply}


async def read_objects(
    redis: Redis,
    prefix: str,
    kinds: Inspected,
    objects: list[tuple[str, str]],
    sharded: bool = False,
) -> list[LockInfo]:
    """What Redis says about each of *objects* (``(kind, name)``), in that order: one
    pipeline per :data:`BATCH` objects, which starts with the server's ``TIME``; each
    object's reads and their meaning are its kind's :class:`Describer`'s."""
    numsub = "PUBSUB SHARDNUMSUB" if sharded else "PUBSUB NUMSUB"
    infos: list[LockInfo] = []
    for start in range(0, len(objects), BATCH):
        batch = objects[start : start + BATCH]
        async with redis.pipeline(transaction=False) as pipe:
            pipe.time()
            for kind, name in batch:
                describer, key = kinds[kind], lock_key(prefix, kind, name)
                if describer.string:
                    pipe.get(key)
                else:
                    pipe.hgetall(key)  # a key of another type answers an error: no holders
                pipe.pttl(key)
                pipe.execute_command(numsub, f"{key}:released")
                describer.queue(pipe, key)
            replies = await pipe.execute(raise_on_error=False)
        seconds, micros = replies[0]
        now_ms = seconds * 1000 + micros / 1000
        at = 1
        for kind, name in batch:
            describer = kinds[kind]
            raw, pttl, subscribers, *extra = replies[at : at + 3 + describer.extra]
            at += 3 + describer.extra
            fields = (
                {text_of(k): text_of(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
            )
            base = LockInfo(
                kind=kind,
                name=name,
                key=lock_key(prefix, kind, name),
                ttl=ttl_of(pttl),
                listeners=_numsub(subscribers),
            )
            info = describer.parse(base, raw, fields, extra, now_ms)
            if info is not None:
                infos.append(info)
    return infos
