"""The ``aiolock`` command: list, show, force-release and watch the locks in a Redis.

``aiolock [--url URL] [--prefix P] [--json] COMMAND ...``; see ``docs/cli.md``. Reading
is done by :mod:`aiolock._inspect` (read-only commands); ``force-release`` goes through a
:class:`~aiolock.LockManager` and the kind's own handle, so holders learn of it as a
loss and waiters wake, as with the library's ``force_release()``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TextIO
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import AuthenticationError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._cluster import _server_mode
from ._errors import LockConnectionError, LockError
from ._inspect import (
    KINDS,
    LABELS,
    Holder,
    LockInfo,
    Who,
    describe,
    find_objects,
    glob_escape,
    lock_key,
    parse_key,
    read_objects,
    resolve,
    scan,
    sort_objects,
)
from ._keys import IDENTITY_TAG, split_key

__all__ = ["main"]

DEFAULT_URL = "redis://127.0.0.1:6379/0"
#: exit status when Redis cannot be reached (or the URL is not one)
EXIT_UNREACHABLE = 2
#: exit status when Redis answered a command with an error (auth, ACL, wrong type, ...)
EXIT_REDIS_ERROR = 3
#: exit status after Ctrl-C (128 + SIGINT, as shells report it)
EXIT_INTERRUPTED = 130
#: keys the hint for an empty prefix looks at, at most (SCAN is bounded, never KEYS)
HINT_SCAN_LIMIT = 20_000


class _Unreachable(Exception):
    """Redis could not be reached: reported as one line, exit status 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiolock",
        description="Inspect and administer aiolock locks in a Redis server or Redis Cluster.",
    )
    _global_options(parser, argparse.SUPPRESS)
    # The same options after the command (``aiolock list --url ...``); SUPPRESS keeps a
    # subcommand that was not given one from overwriting the value given before it.
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("list", parents=[common], help="every lock object under the prefix")
    show = commands.add_parser(
        "show", parents=[common], help="one name, every kind found for it, in detail"
    )
    show.add_argument("name")
    force = commands.add_parser(
        "force-release", parents=[common], help="free a lock whoever holds it (holders see a loss)"
    )
    force.add_argument("name")
    force.add_argument("--kind", choices=list(KINDS), help="which object (needed if several)")
    force.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    watch = commands.add_parser(
        "watch", parents=[common], help="print every release message as it comes"
    )
    watch.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    watch.add_argument("--count", type=int, default=None, help="stop after N messages")
    return parser


def _global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--url",
        default=default,
        help=f"Redis URL (any node of a cluster; default: $REDIS_URL, else {DEFAULT_URL})",
    )
    parser.add_argument("--prefix", default=default, help="key prefix (default: aiolock)")
    parser.add_argument(
        "--json", action="store_true", default=default, help="print JSON instead of tables"
    )


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    args = _parser().parse_args(argv)
    args.url = getattr(args, "url", None) or os.environ.get("REDIS_URL") or DEFAULT_URL
    args.prefix = getattr(args, "prefix", "aiolock")
    args.json = getattr(args, "json", False)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 nothing done, 2 no Redis,
    3 an error reply from Redis, 130 interrupted)."""
    args = _parse(argv)
    try:
        return asyncio.run(_run(args))
    except _Unreachable as exc:
        _error(args.url, f"cannot reach redis at {args.url}: {exc}")
        return EXIT_UNREACHABLE
    except (RedisError, RedisClusterException) as exc:
        # An error reply (NOAUTH, NOPERM, WRONGTYPE, ...): one line, never a traceback.
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        _error(args.url, f"redis at {args.url} answered with an error: {what}")
        return EXIT_REDIS_ERROR
    except LockError as exc:  # aiolock refused (a key of another type, ...): says why
        _error(args.url, str(exc))
        return EXIT_REDIS_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _error(url: str, message: str) -> None:
    """Print *message* on stderr with the password of *url* masked wherever it appears."""
    print(f"aiolock: {mask(message, url)}", file=sys.stderr)


def mask(text: str, url: str) -> str:
    """*text* with *url* shown without its password, and the password itself hidden
    wherever else it appears (an error message that repeats it)."""
    secrets = _secrets(url)
    text = text.replace(url, _masked_url(url))
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _secrets(url: str) -> set[str]:
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return set()
    found = set()
    if password:
        found |= {password, unquote(password)}
    for pair in parts.query.split("&"):
        name, _, value = pair.partition("=")
        if name == "password" and value:
            found |= {value, unquote(value)}
    return found


def _masked_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        if parts.password is None and "password=" not in parts.query:
            return url
        netloc = parts.netloc
        if parts.password is not None:
            user = quote(parts.username or "", safe="")
            netloc = f"{user}:***@{netloc.rpartition('@')[2]}"
        query = "&".join(
            "password=***" if pair.startswith("password=") else pair
            for pair in parts.query.split("&")
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "<the url given>"


@dataclass
class _Target:
    """What the command talks to: one server, or a Redis Cluster and its primaries."""

    redis: Redis
    cluster: RedisCluster | None = None
    #: clients of the cluster's primaries, by node name (made on first use)
    nodes: dict[str, Redis] = field(default_factory=dict)

    @property
    def client(self) -> Redis | RedisCluster:
        """The client a LockManager gets."""
        return self.cluster if self.cluster is not None else self.redis

    def primaries(self) -> list[Redis]:
        """A client per primary (the one server when it is not a cluster)."""
        if self.cluster is None:
            return [self.redis]
        return [self.node(node) for node in self.cluster.get_primaries()]

    def owner(self, name: str) -> Redis:
        """The client of the node that holds every key of *name* (they share one slot)."""
        if self.cluster is None:
            return self.redis
        slot = key_slot(lock_key("p", "lock", name).encode("utf-8"))
        return self.node(self.cluster.nodes_manager.get_node_from_slot(slot))

    def node(self, node: ClusterNode) -> Redis:
        client = self.nodes.get(node.name)
        if client is None:
            pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
            client = self.nodes[node.name] = Redis(connection_pool=pool)
        return client

    async def aclose(self) -> None:
        for client in self.nodes.values():
            await client.aclose()
        if self.cluster is not None:
            await self.cluster.aclose()
        await self.redis.aclose()


@contextlib.asynccontextmanager
async def _connect(url: str) -> AsyncIterator[_Target]:
    """The server at *url*, as a cluster when it says it is a Redis Cluster node."""
    try:
        redis = Redis.from_url(url)
    except ValueError as exc:  # not a redis URL at all
        raise _Unreachable(str(exc)) from None
    target = _Target(redis)
    try:
        try:
            await redis.ping()
            if await _is_cluster_node(redis):
                target.cluster = RedisCluster.from_url(url)
                await target.cluster.initialize()
        except AuthenticationError:
            raise  # reached, but refused: an error reply (exit 3), not "cannot reach"
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise _Unreachable(str(exc) or type(exc).__name__) from None
        yield target
    finally:
        await target.aclose()


async def _is_cluster_node(redis: Redis) -> bool:
    """Whether the server is a Redis Cluster node (``HELLO``'s mode, as the manager checks)."""
    try:
        hello = await redis.execute_command("HELLO")  # type: ignore[no-untyped-call]
    except RedisError:  # a Redis older than 6.2: no HELLO, and no cluster to worry about
        return False
    return _server_mode(hello) == "cluster"


async def _run(args: argparse.Namespace) -> int:
    async with _connect(args.url) as target:
        try:
            return await _command(target, args)
        except (RedisConnectionError, RedisTimeoutError, LockConnectionError) as exc:
            # lost half-way (a server restart, a failover): still one line, no traceback
            raise _Unreachable(str(exc) or type(exc).__name__) from None


async def _command(target: _Target, args: argparse.Namespace) -> int:
    if args.command == "list":
        infos = await _list(target, args.prefix)
        code = _print_list(infos, args.json)
        if not infos:
            await _hint(target, args.prefix, args.json)
        return code
    if args.command == "show":
        return _print_show(args.name, await _describe(target, args.prefix, args.name), args.json)
    if args.command == "force-release":
        return await _force_release(target, args)
    if target.cluster is not None:
        print(
            "aiolock: watch does not work on a Redis Cluster: aiolock publishes there with "
            "sharded pub/sub (SPUBLISH), which has no pattern subscriptions; use list or show",
            file=sys.stderr,
        )
        return 1
    return await _watch(target.redis, args)


async def _list(target: _Target, prefix: str) -> list[LockInfo]:
    """Every lock object under *prefix*: on a cluster, from every primary."""
    if target.cluster is None:
        return await scan(target.redis, prefix)
    infos: list[LockInfo] = []
    for node in target.primaries():
        infos += await read_objects(node, prefix, await find_objects(node, prefix), sharded=True)
    order = {obj: i for i, obj in enumerate(sort_objects((i.kind, i.name) for i in infos))}
    infos.sort(key=lambda info: order[(info.kind, info.name)])
    return await resolve(target.cluster, prefix, infos)


async def _describe(target: _Target, prefix: str, name: str) -> list[LockInfo]:
    """Every object under *name*, read on the node that owns its slot."""
    if target.cluster is None:
        return await describe(target.redis, prefix, name)
    node = target.owner(name)
    return await describe(node, prefix, name, sharded=True, identities=target.cluster)


async def _hint(target: _Target, prefix: str, as_json: bool) -> None:
    """Say which other prefixes hold aiolock keys (a mistyped ``--prefix`` is the usual
    reason for an empty list); looks at :data:`HINT_SCAN_LIMIT` keys per node at most."""
    found: set[str] = set()
    for node in target.primaries():
        seen = 0
        async for raw in node.scan_iter(match="*:*:{*", count=1000):
            seen += 1
            split = split_key(raw.decode("utf-8", errors="replace"))
            if split is not None and split[1] != IDENTITY_TAG and split[0] != prefix:
                found.add(split[0])
            if seen >= HINT_SCAN_LIMIT or len(found) >= 10:
                break
    if found:
        others = ", ".join(repr(p) for p in sorted(found))
        print(
            f"no locks under the prefix {prefix!r}; aiolock keys exist under {others}: "
            "pass --prefix",
            file=sys.stderr if as_json else sys.stdout,
        )


# -- output ------------------------------------------------------------------------------


def _ttl_text(ttl: float | None) -> str:
    return "-" if ttl is None else f"{ttl:.1f}s"


def _who_text(who: Holder | Who) -> str:
    """``billing-worker@web-1 pid 4242``, or ``(no record)`` when the record is gone."""
    if who.host is None and who.pid is None:
        return "(no record)"
    return f"{who.name or '?'}@{who.host or '?'} pid {who.pid if who.pid is not None else '?'}"


def _holders_text(info: LockInfo) -> str:
    if not info.holders:
        return "-"
    parts = []
    for holder in info.holders:
        role = f" {holder.role}" if holder.role else ""
        parts.append(f"{holder.owner}{role} x{holder.count} {_who_text(holder)}")
    return ", ".join(parts)


def _hold_line(info: LockInfo, holder: Holder) -> str:
    unit = "permit" if info.kind == "semaphore" else "hold"
    role = f" ({holder.role})" if holder.role else ""
    line = f"    {holder.owner}{role}: {_plural(holder.count, unit)}, {_who_text(holder)}"
    if holder.lease_left is not None:
        line += f", lease left {holder.lease_left:.1f}s"
    if holder.held_for is not None:
        line += f", held for {holder.held_for:.1f}s"
    return line


def _plural(count: int, what: str) -> str:
    """``1 hold``, ``2 holds``."""
    return f"{count} {what}" if count == 1 else f"{count} {what}s"


def _job_line(job: dict[str, Any]) -> str:
    since = job.get("since")
    stamp = (
        datetime.fromtimestamp(since).strftime("%Y-%m-%d %H:%M:%S")
        if isinstance(since, (int, float))
        else "?"
    )
    job_id = job.get("job_id") or "-"
    return f"  job:        {job_id} on {job.get('host')} pid {job.get('pid')} since {stamp}"


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        print("  ".join(cells).rstrip(), file=out)


def _print_list(infos: list[LockInfo], as_json: bool) -> int:
    if as_json:
        print(json.dumps([info.to_dict() for info in infos], indent=2))
        return 0
    if not infos:
        print("no locks")
        return 0
    rows = [["KIND", "NAME", "HOLDERS", "TTL", "WAITERS", "LISTENERS"]]
    for info in infos:
        holders = _holders_text(info)
        if info.kind == "semaphore":
            limit = "?" if info.limit is None else str(info.limit)
            holders = f"{info.held}/{limit} permits: {holders}"
        rows.append([
            info.label,
            info.name,
            holders,
            _ttl_text(info.ttl),
            str(info.waiters),
            str(info.listeners),
        ])  # fmt: skip
    _table(rows, sys.stdout)
    return 0


def _print_show(name: str, infos: list[LockInfo], as_json: bool) -> int:
    if as_json:
        print(json.dumps({"name": name, "objects": [info.to_dict() for info in infos]}, indent=2))
        return 0 if infos else 1
    if not infos:
        print(f"no lock object named {name!r}")
        return 1
    for number, info in enumerate(infos):
        if number:
            print()
        print(f"{info.label} {info.name!r}")
        print(f"  key:        {info.key}")
        print(f"  ttl:        {_ttl_text(info.ttl)}")
        if info.kind == "semaphore":
            print(f"  limit:      {'?' if info.limit is None else info.limit}")
            print(f"  held:       {info.held}")
        print(f"  listeners:  {info.listeners}")
        if info.fence is not None:
            print(f"  fence:      {info.fence} (the last token released or issued)")
        if info.job is not None:
            print(_job_line(info.job))
        print(f"  holders:    {len(info.holders)}")
        for holder in info.holders:
            print(_hold_line(info, holder))
        print(f"  waiters:    {info.waiters}")
        for waiter in info.waiting_who or tuple(Who(text) for text in info.waiting):
            print(f"    {waiter.field}: {_who_text(waiter)}")
    return 0


# -- force-release -----------------------------------------------------------------------


def _confirm(question: str) -> bool:
    print(f"{question} [y/N] ", end="", flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in {"y", "yes"}


async def _force_release(target: _Target, args: argparse.Namespace) -> int:
    from ._manager import LockManager

    infos = await _describe(target, args.prefix, args.name)
    if args.kind is not None:
        infos = [info for info in infos if info.kind == args.kind]
    if not infos:
        kind = f"{LABELS[args.kind]} " if args.kind else ""
        print(f"no {kind}lock object named {args.name!r}: nothing to release")
        return 1
    if len(infos) > 1:
        kinds = ", ".join(info.kind for info in infos)
        print(
            f"aiolock: {args.name!r} names several objects ({kinds}); choose one with --kind",
            file=sys.stderr,
        )
        return 1
    info = infos[0]
    holders = _plural(len(info.holders), "holder")
    question = f"Force-release {info.label} {info.name!r} ({holders})?"
    if not args.yes and not _confirm(question):
        print("not released")
        return 1
    async with LockManager(target.client, prefix=args.prefix, identity=False) as locks:
        if info.kind == "lock":
            held = await locks.lock(info.name).force_release()
        elif info.kind == "fair":
            held = await locks.fair_lock(info.name).force_release()
        elif info.kind == "rw":
            # both sides share one structure and one force release script
            held = await locks.rw_lock(info.name).write().force_release()
        else:
            limit = info.limit if info.limit is not None else max(1, info.held or 1)
            held = await locks.semaphore(info.name, limit=limit).force_release()
    print(f"released {info.label} {info.name!r}" if held else f"{info.name!r} was not held")
    return 0


# -- watch -------------------------------------------------------------------------------


async def _watch(redis: Redis, args: argparse.Namespace) -> int:
    pubsub = redis.pubsub()
    pattern = f"{glob_escape(args.prefix)}:*released"
    await pubsub.psubscribe(pattern)
    deadline = None if args.duration is None else time.monotonic() + args.duration
    seen = 0
    try:
        while args.count is None or seen < args.count:
            wait = 1.0
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    break
                wait = min(wait, 1.0)
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=wait)
            if message is None or message.get("type") != "pmessage":
                continue
            event = _event(args.prefix, message)
            if event is None:
                continue
            seen += 1
            if args.json:
                print(json.dumps(event), flush=True)
            else:
                stamp = datetime.fromtimestamp(event["time"]).strftime("%H:%M:%S.%f")[:-3]
                label = LABELS[event["kind"]]
                what = _event_text(event)
                print(f"{stamp}  {label:<9}  {event['name']}  {what}", flush=True)
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
    return 0


def _event(prefix: str, message: dict[str, Any]) -> dict[str, Any] | None:
    channel = _decode(message["channel"])
    parsed = parse_key(prefix, channel)
    if parsed is None or parsed[2] != ":released":
        return None
    kind, name, _ = parsed
    return {
        "time": time.time(),
        "kind": kind,
        "name": name,
        "channel": channel,
        "message": _decode(message["data"]),
        # A fair lock publishes only when it hands the lock to its next waiter (the
        # message is that waiter's field); the other kinds publish every release (the
        # message is the releasing manager's id).
        "event": "granted" if kind == "fair" else "released",
    }


def _event_text(event: dict[str, Any]) -> str:
    if event["event"] == "granted":
        return f"granted to {event['message']}"
    return f"released by {event['message']}"


def _decode(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
