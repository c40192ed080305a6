"""The kinds the ``aiolock`` command shows, each with the describer of its layout.

The reading itself is :mod:`aiolock._redis.inspect`'s, which may import no kind: each
kind describes its own keys (``aiolock/_kinds/<kind>/inspect.py``, Redlock's in
``aiolock/_redlock/inspect.py``), and this module, above the kinds and the topologies,
hands their table (:data:`DESCRIBERS`) to it. A new kind adds its describer here
(docs/architecture.md, "Adding a kind"; tests/unit/test_structure.py checks).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from aiolock._kinds.fair.inspect import FairDescriber
from aiolock._kinds.lock.inspect import LockDescriber
from aiolock._kinds.rw.inspect import ReadWriteDescriber
from aiolock._kinds.semaphore.inspect import SemaphoreDescriber
from aiolock._redis import inspect
from aiolock._redis.inspect import (
    KINDS,
    LABELS,
    Holder,
    Inspected,
    LockInfo,
    Who,
    glob_escape,
    lock_key,
    parse_key,
    resolve,
    sort_objects,
)
from aiolock._redlock.inspect import RedlockDescriber

__all__ = [
    "DESCRIBERS",
    "KINDS",
    "LABELS",
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

#: Every kind the command shows, with its describer (in :data:`KINDS` order).
DESCRIBERS = Inspected(
    LockDescriber(),
    FairDescriber(),
    ReadWriteDescriber(),
    SemaphoreDescriber(),
    RedlockDescriber(),
)


async def scan(
    redis: Redis, prefix: str, *, sharded: bool = False, identities: Any = None
) -> list[LockInfo]:
    """Every lock object under *prefix* (:func:`aiolock._redis.inspect.scan`)."""
    return await inspect.scan(redis, prefix, DESCRIBERS, sharded=sharded, identities=identities)


async def find_objects(redis: Redis, prefix: str) -> list[tuple[str, str]]:
    """``(kind, name)`` of every lock object under *prefix*, sorted."""
    return await inspect.find_objects(redis, prefix, DESCRIBERS)


async def read_objects(
    redis: Redis, prefix: str, objects: list[tuple[str, str]], sharded: bool = False
) -> list[LockInfo]:
    """What Redis says about each of *objects* (``(kind, name)``), in that order."""
    return await inspect.read_objects(redis, prefix, DESCRIBERS, objects, sharded)


async def describe(
    redis: Redis, prefix: str, name: str, *, sharded: bool = False, identities: Any = None
) -> list[LockInfo]:
    """Every kind of object that exists under *name* (:func:`aiolock._redis.inspect.describe`)."""
    return await inspect.describe(
        redis, prefix, name, DESCRIBERS, sharded=sharded, identities=identities
    )
