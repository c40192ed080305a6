"""What the wire formats shared with other clients have in common: keys and polling.

The ``token`` and ``timestamp`` formats keep the lock itself where other clients look for
it, at the lock name ``N`` itself, with no prefix. Everything only aiolock needs (release
tombstones, void markers of cancelled attempts, the release channel, and for the
timestamp lock the record of who wrote the value) lives under the manager's prefix ``P``,
in ``P:<format>:{H}...`` (see :func:`aux_base`), where ``H`` is the text Redis Cluster
hashes ``N`` by: the name's own hash tag if it has one, else the whole name (or, for a
name with braces but no usable tag, a short tag found to have the same slot). So on a
cluster every key a script touches lives in the slot of ``N``.

Other clients never publish when they release, so a waiter of these formats cannot sleep
until a message while such a client holds the lock: it polls, with the backoff of
:class:`PollBackoff`, and sleeps on pub/sub only while the holder is an aiolock client.

The two string formats (``token``, ``timestamp``) also share :class:`StringKindBase`:
their hold count lives in the process, and their release scripts answer the same codes.
Kinds never import each other, so what they share lives here.
"""

from __future__ import annotations

import functools
import itertools
import time
from typing import Any

from redis.crc import key_slot

from aiolock._engine.kind import Hold, Released, ReleaseStatus, Successor
from aiolock._engine.kindbase import KindBase
from aiolock._errors import LockKeyTypeError
from aiolock._keys import TAGS, LockKeys, check_foreign_key
from aiolock._redis.client import as_int, as_text

__all__ = [
    "POLL_FIRST",
    "POLL_MAX",
    "ForeignKeys",
    "PollBackoff",
    "StringKindBase",
    "aux_base",
    "cluster_hash_tag",
    "slot_tag",
    "string_type_error",
]

#: Seconds between polls of a waiter while another client (which never publishes) holds
#: the lock: the first retry comes after POLL_FIRST, each next one after twice as long,
#: up to POLL_MAX. POLL_MAX bounds how long a waiter sleeps through a foreign release
#: (plus one round trip); a waiting name costs 4 attempts in the first 0.15 s, then
#: 1 / POLL_MAX attempts per second per process (only the head of a process's queue polls).
POLL_FIRST = 0.01
POLL_MAX = 0.1


def cluster_hash_tag(name: str) -> str | None:
    """The hash tag Redis Cluster hashes *name* by, or None if it hashes the whole name."""
    start = name.find("{")
    if start >= 0:
        end = name.find("}", start + 1)
        if end > start + 1:
            return name[start + 1 : end]
    return None


class ForeignKeys(LockKeys):
    """The keys of a lock kept at the raw name ``N``, shared with other clients.

    ``lock`` is ``N`` itself; the auxiliary keys and the channel are aiolock's own, under
    :func:`aux_base` (see the module docstring).
    """

    __slots__ = ("base",)

    def __init__(self, prefix: str, name: str, kind: str, wire: str) -> None:
        # LockKeys.__init__ puts every key under the prefix; here only the auxiliary keys
        # are, so the same attributes are set directly.
        self.base = aux_base(prefix, kind, name)
        self.name = name
        self.kind = kind
        # The raw name is the one key outside the prefix: it must not be able to equal a
        # key of aiolock's own layout (another manager's object).
        self.lock = check_foreign_key(name, name, wire)
        self.fence = f"{self.base}:fence"  # unused: these formats have no fencing tokens
        self.channel = f"{self.base}:released"
        self.void_prefix = f"{self.base}:void:"
        self.slot = key_slot(name.encode())

    def tombstone(self, release_id: str) -> str:
        return f"{self.base}:rel:{release_id}"

    def part(self, suffix: str) -> str:
        return f"{self.base}:{suffix}"


def aux_base(prefix: str, kind: str, name: str) -> str:
    """Where aiolock's own keys for the lock at *name* live: ``<base>:<suffix>``.

    * a name without braces (the common case): ``P:<kind>:{N}``;
    * a name with a Cluster hash tag ``H``: ``P:<kind>:{H}:<length of N>:N``;
    * a name with braces but no usable hash tag: ``P:<kind>:{S}#<length of N>:N``, where
      ``S`` is a short tag of the same slot as ``N`` (see :func:`slot_tag`).

    So every auxiliary key shares the Redis Cluster slot of ``N``. The head ``P:<kind>:``
    keeps prefixes and formats apart (see :mod:`aiolock._keys`). Injective, so two names
    never share an auxiliary key: in the first form ``N`` has no ``}`` and is followed by
    a suffix that starts with ``:`` and a letter; in the others the tag has no ``}`` and
    the length fixes where ``N`` ends, and the character after the tag (``:`` or ``#``)
    tells them apart. (The prefix and the format's tag contain no braces.)
    """
    if kind not in TAGS:  # pragma: no cover - a wiring mistake
        raise ValueError(f"unknown key tag {kind!r}; add it to aiolock._keys.TAGS")
    if "{" not in name and "}" not in name:
        return f"{prefix}:{kind}:{{{name}}}"
    tag = cluster_hash_tag(name)
    if tag is not None:
        return f"{prefix}:{kind}:{{{tag}}}:{len(name)}:{name}"
    return f"{prefix}:{kind}:{{{slot_tag(key_slot(name.encode()))}}}#{len(name)}:{name}"


@functools.lru_cache(maxsize=1024)
def slot_tag(slot: int) -> str:
    """The first hex number whose Cluster slot is *slot*: a hash tag that puts a key in
    the slot of a name that has no usable tag of its own. Found by search (about 16384
    tries on average, a few ms), so only for such names, and cached."""
    for number in itertools.count():
        tag = format(number, "x")
        if key_slot(tag.encode()) == slot:
            return tag
    raise AssertionError("unreachable")  # pragma: no cover


class PollBackoff:
    """Per lock name: how long the local head waits before polling a foreign holder again.

    A wait's first poll comes after :data:`POLL_FIRST`, each next one after twice as
    long, up to :data:`POLL_MAX`, whoever holds the lock meanwhile (so clients handing
    the lock around quickly never make a waiter poll faster). A name not polled for
    :data:`RESTART` seconds starts over. The state is a hint only: it is forgotten when
    the lock is taken, and wholesale if it grows past a few thousand names.
    """

    __slots__ = ("_seen",)

    LIMIT = 4096
    #: seconds without a poll after which a name's backoff starts over (a new wait)
    RESTART = 1.0

    def __init__(self) -> None:
        #: lock name -> (when it was last polled, monotonic; the interval given then)
        self._seen: dict[str, tuple[float, float]] = {}

    def next(self, name: str, ttl: float, now: float | None = None) -> float:
        """The wait before the next poll of *name*, held by another client for *ttl* s
        more (0 or less: unknown or no expiry)."""
        now = time.monotonic() if now is None else now
        last = self._seen.get(name)
        if last is None or now - last[0] > last[1] + self.RESTART:
            interval = POLL_FIRST
        else:
            interval = min(last[1] * 2, POLL_MAX)
        if len(self._seen) >= self.LIMIT and name not in self._seen:
            self._seen.clear()
        self._seen[name] = (now, interval)
        # No need to poll after the holder's lease has ended.
        return min(interval, ttl) if ttl > 0 else interval

    def forget(self, name: str) -> None:
        self._seen.pop(name, None)


# release.lua of the string formats (token, timestamp)
_RESENT, _NOT_HELD = 2, 0


def string_type_error(key: str, kind: object) -> LockKeyTypeError:
    return LockKeyTypeError(
        f"Redis key {key!r} holds a {as_text(kind)}, not a lock of the token or timestamp "
        "wire format (a string), so it cannot be used as a lock; pick another lock name, "
        "or delete that key"
    )


class StringKindBase(KindBase):
    """What the string formats (token, timestamp) share: the hold count lives in the
    process, so a nested release or a count only asks Redis whether the hold is still
    there (the renew script with no lease), and a final release (:meth:`_final_release`)
    answers the same codes."""

    reentrant = True

    async def _still_held(self, hold: Hold) -> bool:
        (held,) = await self._client.run(
            self.renew_script, self.renew_keys(hold.keys), (self.renew_value(hold), 0)
        )
        return as_int(held) == 1

    async def _final_release(self, hold: Hold, release_id: str, listening: bool) -> Any:
        """Run the kind's release script for the last hold; its raw reply."""
        raise NotImplementedError

    async def release(
        self,
        hold: Hold,
        count: int,
        release_id: str,
        successor: Successor | None,
        hand_over_freely: bool,
        listening: bool,
    ) -> Released:
        if count > 1:  # nested: the count is ours alone; only check that we still hold it
            if await self._still_held(hold):
                return Released(ReleaseStatus.STILL_HELD, count - 1)
            return Released(ReleaseStatus.NOT_HELD, 0)
        reply = await self._final_release(hold, release_id, listening)
        if isinstance(reply, int):
            return Released(ReleaseStatus.RELEASED, reply)
        code = as_int(reply[0])
        if code == _RESENT:
            return Released(ReleaseStatus.RELEASED, 0)
        if code == _NOT_HELD:
            return Released(ReleaseStatus.NOT_HELD, 0)
        raise string_type_error(hold.keys.lock, reply[1])

    async def hold_count(self, keys: LockKeys, hold: Hold | None) -> int | None:
        """The count is kept here, in the process: Redis is asked whether the hold is
        still there (and, with no hold, whether the key is a string or absent)."""
        if hold is None:
            kind = as_text(await self._client.call("TYPE", keys.lock, key=keys.lock))
            if kind not in ("none", "string"):
                raise string_type_error(keys.lock, kind)
            return 0
        return hold.count if await self._still_held(hold) else 0
