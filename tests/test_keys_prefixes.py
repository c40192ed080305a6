"""Prefixes, kinds and names never share a key (issue 18, item 2).

A prefix may contain ``:`` and the kinds' tags, so before issue 18 prefix ``app:sem`` with
lock ``x`` and prefix ``app`` with semaphore ``x`` both used ``app:sem:{x}``. Every kind now
has a tag right before the ``{`` (``P:lock:{x}``, ``P:sem:{x}``), and the prefix has no
braces, so the prefix and the kind come back from any key (``aiolock._keys.split_key``).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from typing import Any, Literal

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.crc import key_slot

import aiolock
from aiolock._keys import IDENTITY_TAG, TAGS, LockKeys, identity_key, split_key
from aiolock._kinds.foreign import ForeignKeys
from aiolock._kinds.redisson.kind import RedissonKeys
from aiolock._redis.inspect import scan


async def test_a_lock_under_prefix_app_sem_and_a_semaphore_under_app_are_independent(
    redis: Redis, prefix: str
) -> None:
    # Regression: releasing the lock deleted the semaphore's holders (one hash for both),
    # and the semaphore then granted 4 permits with a limit of 2.
    async with (
        aiolock.LockManager(redis, prefix=f"{prefix}:sem") as lock_side,
        aiolock.LockManager(redis, prefix=prefix) as sem_side,
    ):
        lock = lock_side.lock("x", timeout=0)
        semaphore = sem_side.semaphore("x", 2, timeout=0)
        await lock.acquire()
        first = await semaphore.acquire()
        second = await semaphore.acquire()
        await lock.release()
        # Both permits are still held: a third request must not be granted.
        with pytest.raises(aiolock.LockTimeoutError):
            await semaphore.acquire()
        assert await semaphore.holders() == 2
        await first.release()
        await second.release()
        # And the lock is free and works on its own.
        async with lock_side.lock("x", timeout=0):
            pass


async def test_the_inspector_tells_the_two_prefixes_apart(redis: Redis, prefix: str) -> None:
    async with (
        aiolock.LockManager(redis, prefix=f"{prefix}:sem") as lock_side,
        aiolock.LockManager(redis, prefix=prefix) as sem_side,
        lock_side.lock("x"),
        sem_side.semaphore("x", 2),
    ):
        short = await scan(redis, prefix)
        long = await scan(redis, f"{prefix}:sem")
    assert [(info.kind, info.name, info.key) for info in short] == [
        ("semaphore", "x", f"{prefix}:sem:{{x}}")
    ]
    assert [(info.kind, info.name, info.key) for info in long] == [
        ("lock", "x", f"{prefix}:sem:lock:{{x}}")
    ]
    assert len(short[0].holders) == len(long[0].holders) == 1


# -- The property: distinct (prefix, kind, name) never share a key or a channel ----------

#: pieces that make near-collisions likely: separators, every tag, braces, the escape
#: character, the words of the suffixes, and non-ASCII text
PIECES = [":", "a", "x", "~", "#", "1", "é", "锁", "🔒", *sorted(TAGS), "fence", "job", "void"]
PREFIXES = st.one_of(
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=5).map("".join),
    st.text(min_size=1, max_size=20).filter(lambda p: "{" not in p and "}" not in p),
)
NAMES = st.one_of(
    st.lists(st.sampled_from([*PIECES, "{", "}"]), min_size=1, max_size=6).map("".join),
    st.text(min_size=1, max_size=20),
)

#: Every kind of every wire format (and Redlock's locks): how a manager makes its handle.
KINDS = [
    ("aiolock", "lock"),
    ("aiolock", "fair_lock"),
    ("aiolock", "rw_lock"),
    ("aiolock", "semaphore"),
    ("redlock", "lock"),
    ("token", "lock"),
    ("timestamp", "lock"),
    ("redisson", "lock"),
]
Kind = tuple[str, str]
Foreign = Literal["token", "timestamp", "redisson"]
#: suffixes of every part any kind or integration keeps beside an object (``keys.part``)
PARTS = ["queue", "claims", "leases", "expiry", "wants", "limit", "holder", "job"]
#: attempt and release ids, as the engine makes them
IDS = [f"{'ab' * 16}:1", f"{'cd' * 16}:r22"]


@functools.lru_cache(maxsize=256)
def manager_of(prefix: str) -> aiolock.LockManager:
    return aiolock.LockManager(Redis(port=1), prefix=prefix)  # never opened: no I/O


@functools.lru_cache(maxsize=256)
def redlock_of(prefix: str) -> aiolock.RedlockManager:
    return aiolock.RedlockManager([Redis(port=port) for port in (1, 2, 3)], prefix=prefix)


def handle_keys(prefix: str, kind: Kind, name: str) -> LockKeys:
    """The keys of the handle a manager of *prefix* makes for *kind* and *name*."""
    wire, factory = kind
    if wire == "redlock":
        return redlock_of(prefix).lock(name)._keys
    manager = manager_of(prefix)
    if factory == "semaphore":
        handle: Any = manager.semaphore(name, 2, wire=wire)  # type: ignore[arg-type]
    else:
        handle = getattr(manager, factory)(name, wire=wire)
    keys: LockKeys = handle._keys
    return keys


def owned(keys: LockKeys) -> set[str]:
    """Every key and channel aiolock keeps for one object under its manager's prefix."""
    names = {keys.fence, keys.channel, *(keys.part(suffix) for suffix in PARTS)}
    names |= {keys.void(i) for i in IDS} | {keys.tombstone(i) for i in IDS}
    if not isinstance(keys, (ForeignKeys, RedissonKeys)):
        names.add(keys.lock)
    if isinstance(keys, RedissonKeys):
        names -= {keys.channel, keys.fence}  # Redisson's own, outside the prefix
    return names


def foreign(keys: LockKeys) -> set[str]:
    """The keys and channel of a format shared with other clients, outside every prefix."""
    if isinstance(keys, RedissonKeys):
        return {keys.lock, keys.channel, keys.fence}
    if isinstance(keys, ForeignKeys):
        return {keys.lock}
    return set()


def made(prefix: str, kind: Kind, name: str) -> LockKeys | None:
    """The keys, or None when the format refuses the name because a key of its has the
    shape of aiolock's own keys (the error says so)."""
    try:
        return handle_keys(prefix, kind, name)
    except ValueError as exc:
        refused = str(exc)
    # Only a format shared with other clients refuses a name, and only for that reason.
    assert kind[0] in ("token", "timestamp", "redisson"), refused
    assert "has the shape of aiolock's own keys" in refused, refused
    return None


@settings(max_examples=400, deadline=None)
@given(
    first=st.tuples(PREFIXES, st.sampled_from(KINDS), NAMES),
    second=st.tuples(PREFIXES, st.sampled_from(KINDS), NAMES),
)
@example(first=("app:sem", ("aiolock", "lock"), "x"), second=("app", ("aiolock", "semaphore"), "x"))
@example(first=("P:rs:a", ("aiolock", "lock"), "b"), second=("P", ("redisson", "lock"), "a:{b}"))
@example(first=("P", ("aiolock", "lock"), "x"), second=("Q", ("token", "lock"), "P:lock:{x}"))
@example(first=("P", ("aiolock", "lock"), "x"), second=("Q", ("redisson", "lock"), "lock:{x}"))
@example(first=("P", ("token", "lock"), "a"), second=("P", ("token", "lock"), "a:job"))
def test_distinct_prefix_kind_name_never_share_a_key_or_a_channel(
    first: tuple[str, Kind, str], second: tuple[str, Kind, str]
) -> None:
    one, two = made(*first), made(*second)
    if one is None or two is None:
        return
    # Under the prefixes: no key or channel in common unless it is the same object.
    if first != second:
        assert not owned(one) & owned(two), (first, second, owned(one) & owned(two))
    # A key outside every prefix (another client's) is never one of aiolock's own.
    assert not foreign(one) & owned(two), (first, second)
    assert not foreign(two) & owned(one), (first, second)
    # Outside the prefixes, the name alone decides: that is how other clients meet
    # aiolock there (the same name is the same lock whatever the prefix, and the token
    # and timestamp formats share their string on purpose). Distinct names never share
    # the lock's key; Redisson's channel and token counter are shared only where Redisson
    # itself shares them ("x" and "{x}", its prefixName rule).
    if first[2] != second[2] and foreign(one) and foreign(two):
        assert one.lock != two.lock
        common = foreign(one) & foreign(two)
        if common:
            short, long = sorted((first[2], second[2]), key=len)
            assert long == "{" + short + "}" and "{" not in short, (first, second, common)
            assert common <= {one.channel, one.fence}


@settings(max_examples=200, deadline=None)
@given(prefix=PREFIXES, kind=st.sampled_from(KINDS), name=NAMES)
def test_every_key_of_an_object_stays_in_the_slot_of_its_lock(
    prefix: str, kind: Kind, name: str
) -> None:
    keys = made(prefix, kind, name)
    if keys is None:
        return
    slots = {key_slot(key.encode()) for key in owned(keys) | {keys.lock}}
    assert slots == {keys.slot}, (prefix, kind, name)


def test_all_small_triples_are_injective() -> None:
    """Exhaustively over short prefixes and names: every key names exactly one object."""
    pieces = [":", "a", "lock", "sem", "{", "}", "~"]
    prefixes = ["".join(p) for n in (1, 2) for p in itertools.product(pieces[:4], repeat=n)]
    prefixes += ["a:sem", "a:lock", "a:fair", "a:rs", "a:token", "a:ts", "a:redlock", "a:mgr"]
    names = ["".join(p) for n in (1, 2) for p in itertools.product(pieces, repeat=n)]
    seen: dict[str, tuple[str, Kind, str]] = {}
    for prefix in prefixes:
        for kind in KINDS:
            for name in names:
                keys = made(prefix, kind, name)
                if keys is None:
                    continue
                for key in owned(keys):
                    other = seen.setdefault(key, (prefix, kind, name))
                    assert other == (prefix, kind, name), (key, other)
    assert len(seen) > 50_000


def test_a_foreign_name_shaped_like_an_aiolock_key_is_refused_at_the_call() -> None:
    manager = aiolock.LockManager(Redis(port=1), prefix="Q")
    wires: tuple[Foreign, ...] = ("token", "timestamp", "redisson")
    for wire in wires:
        with pytest.raises(ValueError, match=r"'app:lock:\{x\}'.*prefix 'app', tag 'lock'"):
            manager.lock("app:lock:{x}", wire=wire)
        # The same words without aiolock's shape are fine.
        manager.lock("app:lock:x", wire=wire)
        manager.lock("app:other:{x}", wire=wire)
    # Redisson's channel is checked too: "lock:{x}:released" would give the channel
    # "redisson_lock__channel:lock:{x}:released", lock x's under that prefix.
    with pytest.raises(ValueError, match="redisson_lock__channel"):
        manager.lock("lock:{x}:released", wire="redisson")


# -- A manager's identity record (issue 20) never meets an object's key -------------------


@settings(max_examples=300, deadline=None)
@given(
    first=st.tuples(PREFIXES, st.sampled_from(KINDS), NAMES),
    manager_prefix=PREFIXES,
    manager_id=st.sampled_from(["ab" * 16, "0" * 32, "f" * 32]),
)
@example(first=("P", ("aiolock", "lock"), "ab" * 16), manager_prefix="P", manager_id="ab" * 16)
@example(first=("P:mgr", ("aiolock", "lock"), "x"), manager_prefix="P", manager_id="ab" * 16)
@example(first=("P", ("token", "lock"), "P:mgr:{" + "ab" * 16 + "}"), manager_prefix="P",
         manager_id="ab" * 16)  # fmt: skip
def test_an_identity_record_key_is_never_a_key_of_an_object(
    first: tuple[str, Kind, str], manager_prefix: str, manager_id: str
) -> None:
    record = identity_key(manager_prefix, manager_id)
    # The prefix and the tag come back from the record's key, as from every other key.
    assert split_key(record) == (manager_prefix, IDENTITY_TAG, "{" + manager_id + "}")
    keys = made(*first)
    if keys is None:
        return
    assert record not in owned(keys) | foreign(keys), (first, manager_prefix)


async def test_the_inspector_lists_no_identity_record_as_a_lock(redis: Redis, prefix: str) -> None:
    async with aiolock.LockManager(redis, prefix=prefix) as locks:
        key = identity_key(prefix, locks.id)
        for _ in range(500):
            if await redis.exists(key):
                break
            await asyncio.sleep(0.01)
        assert await redis.exists(key)
        assert await scan(redis, prefix) == []
