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
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from redis.asyncio import Redis

from ._keys import ESCAPE, hash_tag, split_key

__all__ = [
    "KINDS",
    "Holder",
    "LockInfo",
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
    """One holder of a lock object: its owner field and its hold count (or permits)."""

    owner: str
    #: hold count (lock, fair, rw) or permits (semaphore)
    count: int
    #: "writer" or "reader" for a read-write lock, "" otherwise
    role: str = ""


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

    @property
    def label(self) -> str:
        """The kind as a table shows it ("fair lock", "rw lock", ...)."""
        return LABELS[self.kind]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (holders as dicts, tuples as lists)."""
        data = asdict(self)
        data["holders"] = [asdict(holder) for holder in self.holders]
        data["waiting"] = list(self.waiting)
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
    return [await _read(redis, prefix, kind, name) for kind, name in objects]


async def describe(redis: Redis, prefix: str, name: str) -> list[LockInfo]:
    """Every kind of object that exists under *name* (none: an empty list)."""
    infos = []
    for kind in KINDS:
        key = lock_key(prefix, kind, name)
        parts = [key + suffix for suffix in _OBJECT_SUFFIXES[kind]]
        if await redis.exists(*parts):
            infos.append(await _read(redis, prefix, kind, name))
    return infos


async def _ttl(redis: Redis, key: str) -> float | None:
    millis = await redis.pttl(key)
    return None if millis < 0 else millis / 1000


async def _listeners(redis: Redis, key: str) -> int:
    channel = f"{key}:released"
    reply = await redis.pubsub_numsub(channel)
    return int(reply[0][1]) if reply else 0


async def _zmembers(redis: Redis, key: str) -> tuple[str, ...]:
    return tuple(_text(member) for member in await redis.zrange(key, 0, -1))


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
    if kind == "lock":
        holders = tuple(Holder(owner, _int(count)) for owner, count in sorted(fields.items()))
        return LockInfo(holders=holders, **common)
    if kind == "fair":
        holders = tuple(Holder(owner, _int(count)) for owner, count in sorted(fields.items()))
        waiting = await _zmembers(redis, f"{key}:queue")
        return LockInfo(holders=holders, waiters=len(waiting), waiting=waiting, **common)
    if kind == "rw":
        writer = fields.get("writer")
        holders = tuple(
            Holder(owner, _int(count), "writer" if owner == writer else "reader")
            for owner, count in sorted(fields.items())
            if owner not in _RW_META
        )
        waiting = await _zmembers(redis, f"{key}:claims")
        return LockInfo(holders=holders, waiters=len(waiting), waiting=waiting, **common)
    # semaphore
    holders = tuple(
        Holder(owner, _int(permits))
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
