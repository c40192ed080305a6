"""What each guarantee of a lock costs Redis: server time per uncontended cycle, one run.

``python -m benchmarks.script_floor [--cycles N] [--repeats R] [--out DIR]``

Issue 7 asks for aiolock's Redis script time per uncontended acquire+release cycle to be at
most 2x redis-py's Lock (benchmark C1). This measures where that limit lies. One private
``redis-server`` (:class:`aiolock.testing.RedisServer`, free loopback port, stopped by pid)
runs, in one process and interleaved over ``--repeats`` rounds, ``--cycles`` sequential
cycles (one command per round trip, as C1 does) of each of these script pairs, and reads
their server time from ``INFO commandstats`` (``usec`` of the commands sent: a script's
EVALSHA includes what it runs):

* **redis-py's Lock**: ``SET key token NX PX`` and redis-py's own release script (taken from
  ``redis.lock.Lock.LUA_RELEASE_SCRIPT`` at run time); the reference of the target;
* **two empty scripts** (``return 1``) sent with aiolock's key and argument counts (3 keys
  and 3 arguments to acquire, 3 keys and 10 arguments to release): what calling two
  scripts with that much input costs before they do anything;
* **scripted mutual exclusion**: the redis-py lock moved into two scripts (SET NX PX; GET,
  compare, DEL), with the lock's key and argument shape trimmed to what it needs;
* then one guarantee of aiolock's lock added at a time, each on top of the previous:
  **+ void marker** (an acquire that arrives after its cancelled caller's undo must not take
  the lock: one more key checked), **+ fencing token** (TIME), **+ pub/sub wake-up** (PUBLISH
  on release, so waiters need not poll), **+ idempotent release** (a tombstone a resent
  release finds however busy the lock is);
* **aiolock's lock before issue 21**: a frozen copy of the scripts as they were
  (``benchmarks/frozen/lock_*_v0.lua``: a hash of hold counts, the fence key kept
  ``fence_ttl``, a tombstone key per release, PUBSUB NUMSUB/PUBLISH on every release);
* **aiolock's lock**: the shipped ``lock/acquire`` and ``lock/release`` scripts with the
  arguments the client sends (issue 21: the whole state of a name in one string; acquire
  MGETs the state and the void marker and SETs it; release GETs and SETs it).

Each row's server us/cycle is the median over the repeats; "/ redis-py" is that divided by
redis-py's median of the same run. Writes ``<out>/script_floor.json`` and a section of
``<out>/RESULTS.md`` between the ``script-floor`` markers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.lock import Lock as RedisPyLock

from aiolock._redis.scripts import Script
from aiolock.testing import RedisServer
from benchmarks.sections import write_section

OWNER = "0123456789abcdef0123456789abcdef:1"
LEASE_MS = "10000"
AIOLOCK = "aiolock's lock"
AIOLOCK_V0 = "aiolock's lock before issue 21 (frozen)"
_FROZEN = Path(__file__).parent / "frozen"

_SET_NX = "return redis.call('set', KEYS[1], ARGV[1], 'nx', 'px', ARGV[2]) and 1 or 0"
_VOID = (
    "if redis.call('exists', KEYS[1], KEYS[2]) == 1 then return 0 end\n"
    "redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2])\n"
)
_GET_DEL = (
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end\nredis.call('del', KEYS[1])\n"
)


@dataclass(frozen=True)
class Pair:
    """An acquire and a release: each a script source (or None: redis-py's SET NX PX)."""

    name: str
    acquire: str | None
    release: str
    #: cycle number -> (keys, args) of the acquire and of the release
    acquire_input: Callable[[int], tuple[list[str], list[str]]]
    release_input: Callable[[int], tuple[list[str], list[str]]]
    #: whether a release reply says the lock was released (the others answer 1, or 0 when
    #: the caller did not hold it)
    released: Callable[[Any], bool] = lambda reply: reply == 1
    #: what to do with an acquire's reply (the lock keeps the token for its release)
    acquired: Callable[[int, Any], None] = lambda i, reply: None


def _plain(i: int) -> tuple[list[str], list[str]]:
    return ["sf:{lock}"], [f"{OWNER}:{i}", LEASE_MS]


def _marked(suffix: str) -> Callable[[int], tuple[list[str], list[str]]]:
    def make(i: int) -> tuple[list[str], list[str]]:
        return ["sf:{lock}", f"sf:{{lock}}:{suffix}:{OWNER}:{i}"], [f"{OWNER}:{i}", LEASE_MS]

    return make


def _aiolock_v0_acquire(i: int) -> tuple[list[str], list[str]]:
    keys = ["sf:{lock}", "sf:{lock}:fence", f"sf:{{lock}}:void:{OWNER}:{i}"]
    return keys, [f"{OWNER}:{i}", LEASE_MS, "0"]


def _aiolock_v0_release(i: int) -> tuple[list[str], list[str]]:
    keys = ["sf:{lock}", "sf:{lock}:fence", f"sf:{{lock}}:rel:{OWNER}:{i}"]
    # field, count, message, token, fence_ttl ms, tombstone ms, successor, its lease,
    # hand over freely, the releasing manager listens (the kind before issue 21)
    return keys, [f"{OWNER}:{i}", "1", OWNER, "1", "60000", "10000", "", "0", "0", "0"]


def _aiolock_acquire(i: int) -> tuple[list[str], list[str]]:
    keys = ["sf:{lock}", f"sf:{{lock}}:void:{OWNER}:{i}"]
    # field, lease, hold count before, the manager's id (aiolock._kinds.lock.kind)
    return keys, [f"{OWNER}:{i}", LEASE_MS, "0", OWNER[:32]]


#: the token each cycle's acquire gave: the release names its hold by it
_TOKENS: dict[int, int] = {}


def _aiolock_release(i: int) -> tuple[list[str], list[str]]:
    # field, count, message, token, free state kept ms, successor, its lease, hand over
    # freely, the releasing manager listens (aiolock._kinds.lock.kind)
    token = str(_TOKENS.pop(i, 0))
    return ["sf:{lock}"], [f"{OWNER}:{i}", "1", OWNER[:32], token, "60000", "", "0", "0", "0"]


def pairs() -> list[Pair]:
    fenced = _VOID + "local t = redis.call('time')\nreturn t[1] * 1000000 + t[2]"
    publish = _GET_DEL + "redis.call('publish', KEYS[1] .. ':released', ARGV[2])\nreturn 1"
    tombstone = _GET_DEL + (
        "redis.call('set', KEYS[2], '0', 'px', ARGV[3])\n"
        "redis.call('publish', KEYS[1] .. ':released', ARGV[2])\nreturn 1"
    )

    def release_msg(i: int) -> tuple[list[str], list[str]]:
        return ["sf:{lock}"], [f"{OWNER}:{i}", OWNER]

    def release_tomb(i: int) -> tuple[list[str], list[str]]:
        return ["sf:{lock}", f"sf:{{lock}}:rel:{OWNER}:{i}"], [f"{OWNER}:{i}", OWNER, "10000"]

    return [
        Pair("redis-py's Lock", None, RedisPyLock.LUA_RELEASE_SCRIPT, _plain, _plain),
        Pair(
            "two empty scripts, aiolock's input",
            "return 1",
            "return 1",
            _aiolock_acquire,
            _aiolock_release,
        ),
        Pair("scripted mutual exclusion", _SET_NX, _GET_DEL + "return 1", _plain, _plain),
        Pair("+ void marker", _VOID + "return 1", _GET_DEL + "return 1", _marked("void"), _plain),
        Pair("+ fencing token", fenced, _GET_DEL + "return 1", _marked("void"), _plain),
        Pair("+ pub/sub wake-up", fenced, publish, _marked("void"), release_msg),
        Pair("+ idempotent release", fenced, tombstone, _marked("void"), release_tomb),
        Pair(
            AIOLOCK_V0,
            (_FROZEN / "lock_acquire_v0.lua").read_text("utf-8"),
            (_FROZEN / "lock_release_v0.lua").read_text("utf-8"),
            _aiolock_v0_acquire,
            _aiolock_v0_release,
            # the common path answers the listener count (0 here), a refusal a list
            released=lambda reply: isinstance(reply, int),
        ),
        Pair(
            AIOLOCK,
            Script("_kinds/lock/acquire").source,
            Script("_kinds/lock/release").source,
            _aiolock_acquire,
            _aiolock_release,
            released=lambda reply: isinstance(reply, int),
            acquired=_TOKENS.__setitem__,
        ),
    ]


def _server_us(client: redis.Redis, names: tuple[str, ...]) -> float:
    stats: dict[str, Any] = client.info("commandstats")
    return float(sum(stats.get(f"cmdstat_{n}", {}).get("usec", 0) for n in names))


def measure(client: redis.Redis, pair: Pair, cycles: int) -> float:
    """Server us per cycle of *cycles* sequential cycles of *pair*."""
    release = client.script_load(pair.release)
    acquire = client.script_load(pair.acquire) if pair.acquire is not None else None
    client.delete("sf:{lock}", "sf:{lock}:fence")

    def cycle(i: int) -> None:
        keys, args = pair.acquire_input(i)
        if acquire is None:
            got = client.set(keys[0], args[0], nx=True, px=int(args[1]))
        else:
            got = client.evalsha(acquire, len(keys), *keys, *args)
        if not got:
            raise RuntimeError(f"{pair.name}: the lock was not free at cycle {i}")
        pair.acquired(i, got)
        keys, args = pair.release_input(i)
        if not pair.released(client.evalsha(release, len(keys), *keys, *args)):
            raise RuntimeError(f"{pair.name}: the release failed at cycle {i}")

    for i in range(50):  # warm-up
        cycle(-1 - i)
    # A script's EVALSHA includes what it runs, which Redis adds to those commands' own
    # stats too: count SET only where the client sends it (redis-py's acquire).
    names = ("evalsha", "set") if pair.acquire is None else ("evalsha",)
    before = _server_us(client, names)
    for i in range(cycles):
        cycle(i)
    return (_server_us(client, names) - before) / cycles


def run(cycles: int, repeats: int) -> dict[str, Any]:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        try:
            version = str(client.info("server")["redis_version"])
            samples: dict[str, list[float]] = {p.name: [] for p in pairs()}
            for _ in range(repeats):
                for pair in pairs():
                    samples[pair.name].append(measure(client, pair, cycles))
        finally:
            client.close()
    medians = {name: statistics.median(v) for name, v in samples.items()}
    reference = medians["redis-py's Lock"]
    return {
        "server": version,
        "cycles": cycles,
        "repeats": repeats,
        "rows": [
            {
                "pair": name,
                "server_us_per_cycle": medians[name],
                "range": [min(v), max(v)],
                "vs_redis_py": medians[name] / reference,
            }
            for name, v in samples.items()
        ],
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        "### Script floor: server time per uncontended cycle, one guarantee at a time",
        "",
        f"`python -m benchmarks.script_floor`: Redis {result['server']}, "
        f"{result['cycles']:,} sequential cycles per pair, median of {result['repeats']} "
        "interleaved repeats (INFO commandstats `usec` of EVALSHA, and of SET where the "
        "client sends it).",
        "",
        "| script pair | server us/cycle | range | / redis-py's Lock |",
        "|---|---|---|---|",
    ]
    for row in result["rows"]:
        low, high = row["range"]
        lines.append(
            f"| {row['pair']} | {row['server_us_per_cycle']:.2f} | {low:.2f}-{high:.2f} "
            f"| {row['vs_redis_py']:.2f}x |"
        )
    by_name = {row["pair"]: row["server_us_per_cycle"] for row in result["rows"]}
    if by_name.get(AIOLOCK_V0):
        lines += [
            "",
            f"{AIOLOCK} / {AIOLOCK_V0}: **{by_name[AIOLOCK] / by_name[AIOLOCK_V0]:.2f}x**.",
        ]
    lines += [
        "",
        "Each `+` row adds one guarantee of aiolock's lock to the row above it. C1's target "
        "(<= 2x redis-py's Lock) leaves a script pair about one redis-py Lock cycle of room "
        "beyond redis-py's own work. Issue 21's target: aiolock's lock <= 0.70x the frozen "
        "row before it and <= 3.6x redis-py's Lock.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.repeats < 1:
        parser.error("--cycles and --repeats must be at least 1")
    started = time.monotonic()
    result = run(args.cycles, args.repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "script_floor.json").write_text(json.dumps(result, indent=2) + "\n")
    text = render(result)
    write_section(args.out / "RESULTS.md", "script-floor", text)
    print(text)
    print(f"\n({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
