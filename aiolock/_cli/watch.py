"""``aiolock watch``: what happens to the locks under a prefix, as it happens.

Two sources, one stream of events:

* every release message (``PSUBSCRIBE`` on one server, sharded subscriptions on a
  Cluster): ``released`` (a plain lock, a read-write lock, a semaphore) or ``granted``
  (a fair lock hands it to its next waiter), with who did it, ``name@host pid``, from
  the identity record of the manager the message names;
* what no message shows: hand-overs inside one process (a release of a manager gives
  the lock to another of its own tasks, and publishes nothing) and tasks waiting there.
  Every second the watch reads the managers' contention summaries
  (:mod:`aiolock._engine.contention`) and prints a ``local`` event per manager and name
  whose grants or waiting tasks changed: grants and local hand-overs since the last
  look, tasks waiting now.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from datetime import datetime
from typing import Any

from redis.asyncio import Redis

from aiolock._cli.inspect import LABELS, glob_escape, parse_key
from aiolock._cli.target import ShardedWatch, Target
from aiolock._cli.top import INSPECTED, read_summaries, who_text
from aiolock._keys import identity_key
from aiolock._redis.identity import manager_of, parse_record

__all__ = ["EXIT_INTERRUPTED", "LOCAL_PERIOD", "watch"]

#: The exit status of a command stopped by Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130
#: Seconds between two looks at the managers' contention summaries.
LOCAL_PERIOD = 1.0


async def watch(target: Target, args: argparse.Namespace) -> int:
    """The command (see the module docstring)."""
    # Ctrl-C stops the loop by a flag it checks between reads (each at most 1 s), not only
    # by cancelling the task: redis-py's get_message() can swallow a cancellation that
    # lands inside its read, and the watch then ran on after SIGINT (seen on loaded CI
    # runs). The handler is in place before the subscription, which is when a caller may
    # take the watch for started: a Ctrl-C between the two went to asyncio.run's own
    # handler, whose cancellation the first read could swallow, and the watch ran on
    # (issue 25). A cancellation that was swallowed all the same ends the loop too (3.11+
    # counts it). Where the loop cannot take signals (Windows), KeyboardInterrupt ends it.
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, interrupted.set)
        handled = True
    except (NotImplementedError, RuntimeError):
        handled = False
    cancelling = getattr(asyncio.current_task(), "cancelling", lambda: 0)
    source: _PatternWatch | ShardedWatch | None = None
    try:
        if target.cluster is None:
            source = _PatternWatch(target.redis)
            await source.subscribe(f"{glob_escape(args.prefix)}:*released")
        else:
            source = ShardedWatch(target, args.prefix)
        deadline = None if args.duration is None else time.monotonic() + args.duration
        names = _Names(target, args.prefix)
        local = _LocalActivity(target, args.prefix, enabled=not args.no_local)
        seen = 0
        while args.count is None or seen < args.count:
            if interrupted.is_set() or cancelling():
                return EXIT_INTERRUPTED
            wait = min(1.0, max(local.due - time.monotonic(), 0.0))
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wait = min(wait, left)
            events = await local.poll() if time.monotonic() >= local.due else []
            message = await source.get(wait) if wait > 0 else None
            if message is not None:
                event = _event(args.prefix, message)
                if event is not None:
                    event["who"] = await names.who(event["message"])
                    events.append(event)
            for event in events:
                if args.count is not None and seen >= args.count:
                    break
                seen += 1
                _print(event, args.json)
    finally:
        if handled:
            loop.remove_signal_handler(signal.SIGINT)
        if source is not None:
            await source.aclose()
    return EXIT_INTERRUPTED if interrupted.is_set() else 0


class _PatternWatch:
    """Every release channel under the prefix of one server, by one PSUBSCRIBE."""

    def __init__(self, redis: Redis) -> None:
        self._pubsub = redis.pubsub()

    async def subscribe(self, pattern: str) -> None:
        await self._pubsub.psubscribe(pattern)

    async def get(self, timeout: float) -> dict[str, Any] | None:
        message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout)
        return message if message is not None and message.get("type") == "pmessage" else None

    async def aclose(self) -> None:
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]


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


def _print(event: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(event), flush=True)
        return
    stamp = datetime.fromtimestamp(event["time"]).strftime("%H:%M:%S.%f")[:-3]
    label = LABELS[event["kind"]]
    print(f"{stamp}  {label:<9}  {event['name']}  {_event_text(event)}", flush=True)


def _event_text(event: dict[str, Any]) -> str:
    if event["event"] == "local":
        grants = f"{event['grants']} grant{'' if event['grants'] == 1 else 's'}"
        handed = f" ({event['handovers']} handed over locally)" if event["handovers"] else ""
        return f"{grants}{handed}, {event['waiting']} waiting, in {event['who']}"
    if event["event"] == "granted":
        return f"granted to {event['who']}"
    return f"released by {event['who']}"


class _Names:
    """Who a manager id (or a field starting with one) is, from its identity record;
    remembered once found."""

    def __init__(self, target: Target, prefix: str) -> None:
        self._target = target
        self._prefix = prefix
        self._known: dict[str, str] = {}

    async def who(self, text: str) -> str:
        manager = manager_of(text)
        if manager is None:
            return text  # not an aiolock manager's id: shown as it came
        known = self._known.get(manager)
        if known is None:
            raw = await self._target.client.get(identity_key(self._prefix, manager))
            record = parse_record(raw)
            known = who_text(record)
            if record is not None:
                self._known[manager] = known
        return known


class _LocalActivity:
    """The managers' summaries, looked at every LOCAL_PERIOD: what changed since."""

    def __init__(self, target: Target, prefix: str, *, enabled: bool = True) -> None:
        self._target = target
        self._prefix = prefix
        #: when the next look is due (monotonic): at once, for a baseline; never with
        #: ``--no-local``
        self.due = 0.0 if enabled else float("inf")
        #: (manager, kind, name) -> (acquisitions, hand-overs, waiting) at the last look;
        #: None before the first, which only takes the baseline
        self._last: dict[tuple[str, str, str], tuple[int, int, int]] | None = None

    async def poll(self) -> list[dict[str, Any]]:
        self.due = time.monotonic() + LOCAL_PERIOD
        now: dict[tuple[str, str, str], tuple[int, int, int]] = {}
        events = []
        for manager, who, rows in await read_summaries(self._target, self._prefix):
            for row in rows:
                key = (manager, str(row["kind"]), str(row["name"]))
                figures = now[key] = (
                    int(row["acquisitions"]),
                    int(row["handovers"]),
                    int(row["waiting"]),
                )
                if self._last is None or INSPECTED.get(key[1]) is None:
                    continue
                before = self._last.get(key, (0, 0, 0))
                grants, handovers = figures[0] - before[0], figures[1] - before[1]
                if grants <= 0 and figures[2] == before[2]:
                    continue
                events.append({
                    "time": time.time(), "kind": INSPECTED[key[1]], "name": key[2],
                    "event": "local", "who": who, "grants": max(grants, 0),
                    "handovers": max(handovers, 0), "waiting": figures[2],
                })  # fmt: skip
        self._last = now
        return events


def _decode(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
