"""One layout per prefix: a manager refuses to open beside a manager of another layout.

The keys under a prefix, what each of them holds and the messages on their channels make
one *layout*, numbered by :data:`aiolock._keys.LAYOUT`. Managers of two layouts do not
exclude each other where their keys differ, and no command of theirs fails to say so:
before issue 18 the lock was ``P:{T}``, since then it is ``P:lock:{T}``, and a manager of
each build held one name at the same time (issue 36: 658 overlapping bodies in 4 s).

So every manager announces its layout in its identity record (field ``l``, see
:mod:`aiolock._redis.identity`), and :func:`check_layout` runs when it opens: one ``SCAN``
pass over the identity records under the prefix (on every primary of a Redis Cluster,
where the records lie in many slots), a ``GET`` of each record found (pipelined by the
client, and routed to its slot's primary on a cluster), and
:class:`~aiolock.IncompatibleLayoutError` for the first live record of another layout,
older or newer. A record lives only while its manager renews it (``PX`` = its lease), so
a record found is a manager open now, or one that died less than a lease ago.

The manager writes its own record *before* it checks, and deletes it again if it refuses:
of two managers of different layouts that open at once, at least one then sees the other
(each writes before it reads, and SCAN returns every key present for its whole run).

Cost: SCAN walks the whole database however few keys match, a call per
:data:`SCAN_COUNT` keys (one call for a database of a few hundred keys, a hundred for
100,000). A node with more than :data:`SCAN_CALLS` calls' worth of keys is checked in part,
and the manager logs a warning that says so. Nothing is added to acquire or release.

What it cannot see: a manager with ``identity=False`` (no record), and builds from before
issue 20, which write no record at all (every build with the lock at ``P:{T}`` is one of
them): ``docs/wire-formats.md`` ("Upgrading") says what to do about those.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

import anyio

from aiolock._errors import (
    IncompatibleLayoutError,
    LockBackendError,
    LockConnectionError,
    LockError,
    LockKeyTypeError,
)
from aiolock._keys import IDENTITY_TAG, LAYOUT, split_key
from aiolock._redis.client import Client
from aiolock._redis.cluster import ClusterClient
from aiolock._redis.identity import Identity, layout_of, manager_of, parse_record
from aiolock._redis.inspect import glob_escape
from aiolock._redis.reach import describe
from aiolock._redis.reply import as_int, as_text

__all__ = ["SCAN_CALLS", "SCAN_COUNT", "check_layout", "refuse_other_layouts"]

logger = logging.getLogger("aiolock")

T = TypeVar("T")

#: Keys each SCAN call looks at (its COUNT): few round trips, each short enough not to
#: hold up the locks' own commands (``aiolock list`` reads 500 a call, its hint 1000).
SCAN_COUNT = 1000
#: SCAN calls per node at most: a node of up to about a million keys is checked whole.
#: Beyond, the check stops there (a warning says so): opening must stay quick, and a
#: database that large is seldom the locks' alone.
SCAN_CALLS = 1000


async def refuse_other_layouts(
    clients: Sequence[Client | ClusterClient],
    prefix: str,
    manager_id: str,
    own: Sequence[Identity],
    what: str,
    limit: float,
    *,
    tolerate: bool = False,
) -> None:
    """The check of a manager that opens, once its records *own* are written (see the
    module docstring): :func:`check_layout` on each of *clients* at once. On a refusal,
    or any failure, *own* are deleted (a manager that did not open leaves no record: of
    another layout, it would keep others out for a lease) and the error is raised, a
    Redis error saying that the manager could not open. With *tolerate* (a Redlock's
    masters, which open with some of them down) a client that fails is logged and left
    out instead."""
    errors: list[tuple[str, LockError]] = []

    async def on(client: Client | ClusterClient) -> None:
        try:
            await check_layout(client, prefix, manager_id, what=what, limit=limit)
        except LockError as exc:  # kept: raised from a task group, it would come grouped
            errors.append((describe(client.redis), exc))

    try:
        if len(clients) == 1:
            await on(clients[0])
        else:
            async with anyio.create_task_group() as tg:
                for client in clients:
                    tg.start_soon(on, client)
        for _, error in errors:
            if isinstance(error, IncompatibleLayoutError):
                raise error
        if errors and not tolerate:
            error = errors[0][1]
            if isinstance(error, LockBackendError):
                raise type(error)(
                    f"the {what} could not open: reading the identity records under the "
                    f"prefix {prefix!r} (to check that no manager of another key layout is "
                    f"open there) failed: {error}"
                ) from error
            raise error
    except BaseException:
        with anyio.CancelScope(shield=True), anyio.move_on_after(limit):
            async with anyio.create_task_group() as tg:
                for identity in own:
                    tg.start_soon(identity.delete)
        raise
    for where, error in errors:
        logger.warning(
            "the %s could not check %s for managers of another key layout on its prefix "
            "%r, and opens without it: %s",
            what,
            where,
            prefix,
            error,
        )


async def check_layout(
    client: Client | ClusterClient,
    prefix: str,
    manager_id: str,
    *,
    what: str,
    limit: float,
) -> None:
    """Raise :class:`IncompatibleLayoutError` if a live identity record under *prefix*
    (other than *manager_id*'s own) announces a layout other than :data:`LAYOUT`.

    *what* names the manager in the error ("LockManager"); each command is bounded by
    *limit* seconds (a :class:`LockConnectionError` when one takes longer). Redis errors
    are raised as they are (:func:`refuse_other_layouts` says that the manager could not
    open)."""
    nodes: Sequence[Client] = (
        await _bounded(client.primary_clients(), limit, "the Redis Cluster slot map")
        if isinstance(client, ClusterClient)
        else [client]
    )
    pattern = f"{glob_escape(prefix)}:{IDENTITY_TAG}:{{*}}"
    for node in nodes:
        cursor = "0"
        for _ in range(SCAN_CALLS):
            reply = await _bounded(
                node.call("SCAN", cursor, "MATCH", pattern, "COUNT", SCAN_COUNT), limit, "SCAN"
            )
            cursor = as_text(reply[0])
            keys = [as_text(key) for key in reply[1]]
            await _check_records(client, prefix, manager_id, keys, what, limit)
            if cursor == "0":
                break
        else:
            logger.warning(
                "the %s on prefix %r checked the identity records of the first %d keys of "
                "a Redis node only (it has more): a manager of another key layout on this "
                "prefix may have gone unnoticed; keeping the locks in a database of their "
                "own makes the check whole (see docs/wire-formats.md, 'Upgrading')",
                what,
                prefix,
                SCAN_CALLS * SCAN_COUNT,
            )


async def _check_records(
    client: Client | ClusterClient,
    prefix: str,
    manager_id: str,
    keys: list[str],
    what: str,
    limit: float,
) -> None:
    """Read the records at *keys* (one SCAN page) and refuse at the first of another layout."""
    others = [key for key in keys if _manager(prefix, key) not in (None, manager_id)]
    if not others:
        return
    # One GET per record (each in a slot of its own on a cluster), sent together: the
    # client pipelines them, and routes each to its primary.
    raws = await _bounded(
        asyncio.gather(
            *(client.call("GET", key, key=key) for key in others), return_exceptions=True
        ),
        limit,
        "GET",
    )
    for key, raw in zip(others, raws, strict=True):
        if isinstance(raw, LockKeyTypeError):  # no string: no record aiolock wrote
            continue
        if isinstance(raw, BaseException):
            raise raw
        data = parse_record(raw)
        if data is None:  # gone since the SCAN, or not a record aiolock wrote
            continue
        found = layout_of(data)
        if found == LAYOUT:
            continue
        left = as_int(await _bounded(client.call("PTTL", key, key=key), limit, "PTTL"))
        raise IncompatibleLayoutError(_refusal(what, prefix, data, found, left))


def _manager(prefix: str, key: str) -> str | None:
    """The manager id of the identity record *key* under *prefix*, or None if *key* is
    not one (a key of a longer prefix that the pattern matched, a stray key)."""
    split = split_key(key)
    if split is None or split[0] != prefix or split[1] != IDENTITY_TAG:
        return None
    rest = split[2]
    return manager_of(rest[1:-1]) if rest.endswith("}") else None


def _refusal(what: str, prefix: str, data: dict[str, Any], found: int | None, left: int) -> str:
    """What happened and what to do. Without the other manager's id, which would let a
    reader of the log release its holds: the record's other fields say who it is."""
    ours = getattr(sys.modules.get("aiolock"), "__version__", "?")
    theirs = data.get("v") if isinstance(data.get("v"), str) else "?"
    if found is None:
        announced = f"a layout this build cannot read ({data.get('l')!r})"
        advice = "stop it before opening this one, or give this one a prefix of its own"
    elif found < LAYOUT:
        announced = f"layout {found}, older than this build's"
        advice = (
            "stop every manager of the older build on this prefix before opening this "
            "build's, or give this build a prefix of its own"
        )
    else:
        announced = f"layout {found}, newer than this build's"
        advice = (
            "run this process on the newer build too, or stop every manager of the newer "
            "build on this prefix before this one opens, or give this one a prefix of "
            "its own"
        )
    expiry = (
        f"its record expires within {left / 1000:.1f} s if that process is no longer running"
        if left >= 0
        else "its record has no expiry: delete it if that process is no longer running"
    )
    return (
        f"the {what} could not open: {_who(data)} (aiolock {theirs}) is a manager on the "
        f"prefix {prefix!r} that announces {announced} (aiolock {ours} uses layout "
        f"{LAYOUT}). Managers of two layouts do not exclude each other: each would take its "
        f"own keys for a lock name, and both would hold it. To upgrade, {advice}; {expiry} "
        "(see docs/wire-formats.md, 'Upgrading')"
    )


def _who(data: dict[str, Any]) -> str:
    """``billing-worker@web-1 pid 4242, process uvicorn, open since 2026-11-26 01:55:02 UTC``
    (the application's name, else the process's, as the ``aiolock`` command shows them)."""

    def text(field: str) -> str:
        value = data.get(field)
        return value if isinstance(value, str) and value else "?"

    pid = data.get("p")
    who = f"{text('n') if 'n' in data else text('c')}@{text('h')} pid "
    who += str(pid) if type(pid) is int else "?"
    if "n" in data:
        who += f", process {text('c')}"
    started = data.get("t")
    if type(started) is int:
        try:
            stamp = datetime.fromtimestamp(started, timezone.utc)
        except (OverflowError, OSError, ValueError):  # a time no calendar has
            return who
        who += f", open since {stamp:%Y-%m-%d %H:%M:%S} UTC"
    return who


async def _bounded(awaitable: Awaitable[T], limit: float, doing: str) -> T:
    try:
        with anyio.fail_after(limit):
            return await awaitable
    except TimeoutError:
        raise LockConnectionError(f"Redis did not answer {doing} within {limit} s") from None
