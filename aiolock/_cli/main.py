"""The ``aiolock`` command: list, show, force-release and watch the locks in a Redis.

``aiolock [--url URL] [--prefix P] [--json] COMMAND ...``; see ``docs/cli.md``. Reading
is done by :mod:`aiolock._redis.inspect` (read-only commands) with each kind's describer
(:mod:`aiolock._cli.inspect`), on one server or on every
primary of a Redis Cluster (:mod:`aiolock._cli.target`); ``force-release`` goes through a
:class:`~aiolock.LockManager` and the kind's own handle, so holders learn of it as a
loss and waiters wake, as with the library's ``force_release()``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from aiolock._cli.inspect import KINDS, LABELS, Holder, LockInfo, Who
from aiolock._cli.target import (
    Target,
    Unreachable,
    connect,
    describe_name,
    hint,
    list_objects,
    mask,
)
from aiolock._cli.top import holder_text, run_top, waiting_by_name
from aiolock._cli.watch import EXIT_INTERRUPTED, watch
from aiolock._errors import LockConnectionError, LockError

__all__ = ["main"]

DEFAULT_URL = "redis://127.0.0.1:6379/0"
#: exit status when Redis cannot be reached (or the URL is not one)
EXIT_UNREACHABLE = 2
#: exit status when Redis answered a command with an error (auth, ACL, wrong type, ...)
EXIT_REDIS_ERROR = 3
# (and EXIT_INTERRUPTED, 130 after Ctrl-C: aiolock._cli.watch)


#: The kinds force-release frees: not a Redlock, which lives on several masters (freeing
#: it on the one server in --url would leave the others holding it).
_RELEASABLE = [kind for kind in KINDS if kind != "redlock"]


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
    force.add_argument("--kind", choices=_RELEASABLE, help="which object (needed if several)")
    force.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    watch = commands.add_parser(
        "watch", parents=[common], help="print every release message as it comes"
    )
    watch.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    watch.add_argument("--count", type=int, default=None, help="stop after N events")
    watch.add_argument(
        "--no-local",
        action="store_true",
        help="only the release messages, not the hand-overs and waits inside each process",
    )
    top = commands.add_parser(
        "top",
        parents=[common],
        help="the hottest names across every manager, live (who holds, who waits)",
    )
    top.add_argument("--once", action="store_true", help="print one snapshot and exit")
    top.add_argument(
        "--interval", type=_positive, default=1.0, help="seconds between screens (default 1)"
    )
    top.add_argument("--limit", type=_count, default=20, help="names shown (default 20)")
    top.add_argument("--duration", type=_positive, default=None, help="stop after S seconds")
    top.add_argument("--count", type=_count, default=None, help="stop after N screens")
    return parser


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


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
    except Unreachable as exc:
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
    except BrokenPipeError:
        # The reader went away (``aiolock watch | head``): nothing more to say to it, and
        # Python's own flush at exit must not report it either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _error(url: str, message: str) -> None:
    """Print *message* on stderr with the password of *url* masked wherever it appears."""
    print(f"aiolock: {mask(message, url)}", file=sys.stderr)


async def _run(args: argparse.Namespace) -> int:
    async with connect(args.url) as target:
        try:
            return await _command(target, args)
        except (RedisConnectionError, RedisTimeoutError, LockConnectionError) as exc:
            # lost half-way (a server restart, a failover): still one line, no traceback
            raise Unreachable(str(exc) or type(exc).__name__) from None


async def _command(target: Target, args: argparse.Namespace) -> int:
    if args.command == "list":
        infos = await list_objects(target, args.prefix)
        code = _print_list(infos, await waiting_by_name(target, args.prefix), args.json)
        line = None if infos else await hint(target, args.prefix)
        if line is not None:
            print(line, file=sys.stderr if args.json else sys.stdout)
        return code
    if args.command == "show":
        infos = await describe_name(target, args.prefix, args.name)
        waiting = await waiting_by_name(target, args.prefix)
        return _print_show(args.name, infos, waiting, args.json)
    if args.command == "force-release":
        return await _force_release(target, args)
    if args.command == "top":
        return await run_top(target, args, mask(args.url, args.url))
    return await watch(target, args)


# -- output ------------------------------------------------------------------------------


def _ttl_text(ttl: float | None) -> str:
    return "-" if ttl is None else f"{ttl:.1f}s"


def _holders_text(info: LockInfo) -> str:
    if not info.holders:
        return "-"
    parts = []
    for holder in info.holders:
        role = f" ({holder.role})" if holder.role else ""
        parts.append(f"{holder_text(holder)}{role} x{holder.count}")
    return ", ".join(parts)


def _hold_line(info: LockInfo, holder: Holder) -> str:
    unit = "permit" if info.kind == "semaphore" else "hold"
    role = f" ({holder.role})" if holder.role else ""
    line = f"    {holder.owner}{role}: {_plural(holder.count, unit)}, {holder_text(holder)}"
    if holder.token is not None:  # the holder's own token (a plain lock's state keeps it)
        line += f", token {holder.token}"
    if holder.lease_left is not None:
        line += f", lease left {holder.lease_left:.1f}s"
    if holder.held_for is not None:
        line += f", held for {holder.held_for:.1f}s"
    return line


def _fence_text(info: LockInfo) -> str:
    """What the fence key of *info* keeps (``fence.lua``'s callers): a fair lock's, the
    last token released, older than its holder's; a read-write lock's, the largest
    released (a reader that still holds may have an older one, a writer's is newer); a
    semaphore's, the last issued (a holder's, or a newer one)."""
    if info.kind == "semaphore":
        return "the last token issued"
    if info.kind == "rw":
        writer = any(holder.role == "writer" for holder in info.holders)
        return "the largest token released" + ("; the writer's token is newer" if writer else "")
    newer = "; the holders' tokens are newer" if info.holders else ""
    return f"the last token released{newer}"


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


def _print_list(
    infos: list[LockInfo], waiting: dict[tuple[str, str], dict[str, int]], as_json: bool
) -> int:
    """*waiting*: the tasks waiting in each process (the managers' contention summaries),
    which a plain lock's waiters, waiting in their processes, show nowhere in Redis."""
    if as_json:
        print(json.dumps([_with_waiting(info, waiting) for info in infos], indent=2))
        return 0
    if not infos:
        print("no locks")
        return 0
    rows = [["KIND", "NAME", "HOLDERS", "TTL", "WAITERS", "WAITING", "LISTENERS"]]
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
            str(sum(waiting.get((info.kind, info.name), {}).values())),
            str(info.listeners),
        ])  # fmt: skip
    _table(rows, sys.stdout)
    return 0


def _with_waiting(info: LockInfo, waiting: dict[tuple[str, str], dict[str, int]]) -> dict[str, Any]:
    """*info* as JSON, with the tasks waiting for it in each process (``waiting_tasks``,
    ``waiting_in``: the managers' contention summaries)."""
    data = info.to_dict()
    per = waiting.get((info.kind, info.name), {})
    data["waiting_tasks"] = sum(per.values())
    data["waiting_in"] = [{"who": who, "waiting": n} for who, n in per.items()]
    return data


def _print_show(
    name: str,
    infos: list[LockInfo],
    waiting: dict[tuple[str, str], dict[str, int]],
    as_json: bool,
) -> int:
    if as_json:
        objects = [_with_waiting(info, waiting) for info in infos]
        print(json.dumps({"name": name, "objects": objects}, indent=2))
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
        if info.kind == "lock":  # who they are, as far as the managers registered
            for who in info.listening:
                print(f"    {who.field}: {holder_text(who)}")
        if info.fence is not None:  # the fence key's token, not a holder's (their lines)
            print(f"  fence:      {info.fence} ({_fence_text(info)})")
        if info.job is not None:
            print(_job_line(info.job))
        print(f"  holders:    {len(info.holders)}")
        for holder in info.holders:
            print(_hold_line(info, holder))
        print(f"  waiters:    {info.waiters}")
        for waiter in info.waiting_who or tuple(Who(text) for text in info.waiting):
            print(f"    {waiter.field}: {holder_text(waiter)}")
        per = waiting.get((info.kind, info.name), {})
        print(f"  waiting:    {sum(per.values())} tasks in processes")
        for process, count in sorted(per.items(), key=lambda item: (-item[1], item[0])):
            print(f"    {process}: {count}")
    return 0


# -- force-release -----------------------------------------------------------------------


def _confirm(question: str) -> bool:
    print(f"{question} [y/N] ", end="", flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in {"y", "yes"}


async def _force_release(target: Target, args: argparse.Namespace) -> int:
    from aiolock._manager import LockManager
    from aiolock._redis.cluster import check_cluster_support

    if target.cluster is not None:
        try:
            check_cluster_support()  # a manager on a cluster needs a recent redis-py
        except TypeError as exc:
            print(f"aiolock: cannot force-release on a Redis Cluster: {exc}", file=sys.stderr)
            return 1
    infos = await describe_name(target, args.prefix, args.name)
    if any(info.kind == "redlock" for info in infos):
        infos = [info for info in infos if info.kind != "redlock"]
        if not infos:
            print(
                f"aiolock: {args.name!r} is a Redlock, held on several masters: "
                "force-release frees one server's objects only, so it leaves it alone "
                "(its holder's lease ends it; or release it from a RedlockManager)",
                file=sys.stderr,
            )
            return 1
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
