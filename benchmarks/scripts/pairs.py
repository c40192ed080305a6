"""The acquire/release pairs whose Redis time the script benchmarks measure.

Each :class:`Pair` is a lock cycle's two scripts (or redis-py's ``SET NX PX``) with the
keys and arguments a client sends on cycle *i*: redis-py's Lock, two empty scripts, the
guarantees of aiolock's lock added one at a time, the lock's earlier scripts (a frozen
copy, ``benchmarks/frozen/lock_*_v0.lua``) and the shipped ones. Both
:mod:`benchmarks.scripts.cycle_time` (one command per round trip) and
:mod:`benchmarks.scripts.pipelined` (every cycle written at once) run them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.lock import Lock as RedisPyLock

from aiolock._redis.scripts import Script

__all__ = ["AIOLOCK", "AIOLOCK_V0", "PIPED", "REDIS_PY", "Pair", "pairs"]

OWNER = "0123456789abcdef0123456789abcdef:1"
LEASE_MS = "10000"
REDIS_PY = "redis-py's Lock"
AIOLOCK = "aiolock's lock"
AIOLOCK_V0 = "aiolock's lock before issue 21 (frozen)"
#: the pairs also run fully pipelined (issue 21's target 1)
PIPED = (REDIS_PY, AIOLOCK_V0, AIOLOCK)
_FROZEN = Path(__file__).resolve().parent.parent / "frozen"

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
    # hand over freely, the releasing manager listens (as the frozen kind sent them)
    return keys, [f"{OWNER}:{i}", "1", OWNER, "1", "60000", "10000", "", "0", "0", "0"]


def _aiolock_acquire(i: int) -> tuple[list[str], list[str]]:
    keys = ["sf:{lock}", f"sf:{{lock}}:void:{OWNER}:{i}", "sf:{lock}:turns"]
    # field, lease; a new acquisition under a field that begins with the manager's id, so
    # not the hold count before nor the manager's id (aiolock._kinds.lock.kind)
    return keys, [f"{OWNER}:{i}", LEASE_MS]


#: the token each cycle's acquire gave: the release names its hold by it
_TOKENS: dict[int, int] = {}


def _aiolock_release(i: int) -> tuple[list[str], list[str]]:
    # how the held state begins (field, one hold, token), token; a final release under a
    # field that begins with the manager's id, the free state kept the default 60 s
    # (fence_ttl's), no successor and nobody listening, so nothing more
    # (aiolock._kinds.lock.kind)
    token = str(_TOKENS.pop(i, 0))
    return ["sf:{lock}"], [f"{OWNER}:{i}|1|{token}|", token]


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
        Pair(REDIS_PY, None, RedisPyLock.LUA_RELEASE_SCRIPT, _plain, _plain),
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
