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
from collections.abc import Callable, Iterator
from typing import Any, Literal

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.crc import key_slot

import aiolock
from aiolock._cli.inspect import scan
from aiolock._formats.foreign import ForeignKeys
from aiolock._formats.redisson.kind import RedissonKeys
from aiolock._keys import (
    IDENTITY_TAG,
    TAGS,
    KeySpace,
    LockKeys,
    check_lease,
    check_name,
    check_prefix,
    check_timeout,
    identity_key,
    new_manager_id,
    split_key,
)
from aiolock.testing import RedisServer


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


# --------------------------------------------------------------------------------------
# The key naming of ``aiolock._keys``: one Cluster slot per lock, an injective mapping,

PREFIX = "aiolock"

#: names built from the characters that matter to hash tags and to the escaping
BRACY_NAMES = st.text(alphabet="{}~:ab", min_size=1, max_size=12)
#: any valid name (hypothesis' text excludes lone surrogates)
ANY_NAMES = st.text(min_size=1, max_size=40)
NAMES = st.one_of(BRACY_NAMES, ANY_NAMES)

CONCRETE = {
    "}x": "aiolock:lock:{~}x}",
    "}": "aiolock:lock:{~}}",
    "~": "aiolock:lock:{~~}",
    "~}": "aiolock:lock:{~~}}",
    "{}": "aiolock:lock:{{}}",
    "a}b": "aiolock:lock:{a}b}",
    "order:42": "aiolock:lock:{order:42}",
}


def cluster_hash_tag(key: str) -> str | None:
    """What Redis Cluster hashes, as the spec says: the text between the first ``{`` and the
    first ``}`` after it when non-empty, else ``None`` (the whole key is hashed)."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end < 0 or end == start + 1:
        return None
    return key[start + 1 : end]


def all_keys(keys: LockKeys, attempt_ids: tuple[str, ...] = ()) -> list[str]:
    """Every key and the channel of one lock (void markers for *attempt_ids*)."""
    ids = attempt_ids or (f"{new_manager_id()}:1", f"{new_manager_id()}:99999")
    return [
        keys.lock,
        keys.fence,
        keys.channel,
        *(keys.void(i) for i in ids),
        *(keys.tombstone(i) for i in ids),
    ]


def check_one_slot(name: str, prefix: str = PREFIX) -> LockKeys:
    keys = KeySpace(prefix, new_manager_id()).keys(check_name(name))
    everything = all_keys(keys)
    tags = {cluster_hash_tag(key) for key in everything}
    assert len(tags) == 1, f"{name!r}: keys with different hash tags: {everything}"
    (tag,) = tags
    assert tag, f"{name!r}: empty hash tag, so each key is hashed whole: {everything}"
    slots = {key_slot(key.encode()) for key in everything}
    assert slots == {keys.slot}, f"{name!r}: keys spread over slots {slots}: {everything}"
    return keys


@settings(max_examples=300, deadline=None)
@given(name=NAMES)
def test_every_key_and_the_channel_of_a_lock_share_one_slot(name: str) -> None:
    keys = check_one_slot(name)
    assert isinstance(keys.slot, int)
    assert 0 <= keys.slot < 16384
    assert keys.name == name


@settings(max_examples=300, deadline=None)
@given(first=NAMES, second=NAMES)
def test_distinct_names_never_share_a_key(first: str, second: str) -> None:
    if first == second:
        assert LockKeys(PREFIX, first).lock == LockKeys(PREFIX, second).lock
        return
    ids = ("0" * 32 + ":1", "f" * 32 + ":2")
    a = set(all_keys(LockKeys(PREFIX, first), ids))
    b = set(all_keys(LockKeys(PREFIX, second), ids))
    assert LockKeys(PREFIX, first).lock != LockKeys(PREFIX, second).lock
    assert not a & b, f"{first!r} and {second!r} share {a & b}"


@given(name=NAMES, other_prefix=st.sampled_from(["aiolock2", "aio", "x:aiolock"]))
def test_different_prefixes_never_share_a_key(name: str, other_prefix: str) -> None:
    ids = ("0" * 32 + ":1",)
    mine = set(all_keys(LockKeys(PREFIX, name), ids))
    for other in (name, "~" + name, name + "}"):
        assert not mine & set(all_keys(LockKeys(other_prefix, other), ids))


def test_all_short_names_over_the_special_characters_are_injective_and_one_slot() -> None:
    """Exhaustive over short names, where escaping bugs live."""
    seen: dict[str, str] = {}
    for size in range(1, 6):
        for chars in itertools.product("{}~a", repeat=size):
            name = "".join(chars)
            keys = check_one_slot(name)
            assert keys.lock not in seen, f"{name!r} and {seen[keys.lock]!r} share {keys.lock}"
            seen[keys.lock] = name


@pytest.mark.parametrize(("name", "lock_key"), CONCRETE.items())
def test_concrete_names(name: str, lock_key: str) -> None:
    keys = check_one_slot(name)
    assert keys.lock == lock_key
    assert keys.fence == f"{lock_key}:fence"
    assert keys.channel == f"{lock_key}:released"
    assert keys.void("m:1") == f"{lock_key}:void:m:1"
    assert keys.tombstone("m:1") == f"{lock_key}:rel:m:1"
    assert keys.slot == key_slot(lock_key.encode())


def test_a_name_starting_with_a_closing_brace_no_longer_spreads_over_slots() -> None:
    """Defect 12: ``P:{}x}`` had an empty hash tag, so each key was hashed whole."""
    keys = LockKeys(PREFIX, "}x")
    assert cluster_hash_tag(keys.lock) == "~"
    assert len({key_slot(k.encode()) for k in (keys.lock, keys.fence, keys.channel)}) == 1


def test_concrete_names_are_pairwise_distinct() -> None:
    assert len({LockKeys(PREFIX, name).lock for name in CONCRETE}) == len(CONCRETE)
    # the escape makes '}x' and '~}x' different locks
    assert LockKeys(PREFIX, "}x").lock != LockKeys(PREFIX, "~}x").lock


# -- against a real server: redis-py's slot function agrees with CLUSTER KEYSLOT -----------


@pytest.fixture(scope="module")
def cluster_mode_url() -> Iterator[str]:
    """A standalone server with cluster support on (no slots served): it answers KEYSLOT."""
    with RedisServer(["--cluster-enabled", "yes"]) as server:
        yield server.url


async def test_slot_agrees_with_the_server(cluster_mode_url: str) -> None:
    client = Redis.from_url(cluster_mode_url, decode_responses=True)
    try:
        for name in [*CONCRETE, "~}~", "}{", "{", "ü🔒}", "a{b}c"]:
            keys = LockKeys(PREFIX, name)
            for key in all_keys(keys):
                slot = await client.execute_command("CLUSTER", "KEYSLOT", key)  # type: ignore[no-untyped-call]
                assert slot == keys.slot
    finally:
        await client.aclose()


@pytest.mark.parametrize("name", ["}x", "}", "~", "~}", "{}", "a}b"])
async def test_a_lock_with_an_odd_name_writes_only_keys_of_its_slot(
    redis: Redis, prefix: str, name: str
) -> None:
    async with aiolock.LockManager(redis, prefix=prefix) as locks:
        lock = locks.lock(name)
        expected = LockKeys(prefix, name)
        assert lock.key == expected.lock
        async with lock:
            assert await lock.locked()
            assert await redis.exists(expected.lock) == 1
            record = f"{prefix}:mgr:{{{locks.id}}}".encode()  # the manager's, not the lock's
            written = [k async for k in redis.scan_iter(match=f"{prefix}:*") if k != record]
            assert written
            slots = {key_slot(key if isinstance(key, bytes) else key.encode()) for key in written}
            assert slots == {expected.slot}, written
        assert not await lock.locked()
        # its neighbours are other locks
        assert not await locks.lock("~" + name).locked()
        async with locks.lock(name):
            assert not await locks.lock("~" + name).locked()
            assert await locks.lock("~" + name).try_acquire()
            await locks.lock("~" + name).release()


# -- defect 13: no 400-digit error messages -----------------------------------------------


HUGE = 10**400


@pytest.mark.parametrize(
    "call",
    [
        lambda: check_lease(HUGE),
        lambda: check_lease(-HUGE),
        lambda: check_lease(10**300),  # fits a float: the range check reports it
        lambda: check_lease(HUGE, "fence_ttl"),
        lambda: check_timeout(HUGE),
        lambda: check_timeout(-HUGE),
        lambda: check_timeout(-(10**300)),
        lambda: check_prefix("{" * 10_000),
    ],
    ids=["lease", "-lease", "lease-range", "fence_ttl", "timeout", "-timeout", "-timeout-range",
         "prefix"],
)  # fmt: skip
def test_error_messages_do_not_print_huge_values(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match=r"…$") as caught:
        call()
    message = str(caught.value)
    assert len(message) < 160, message
    assert "0" * 30 not in message
    assert "{" * 30 not in message


def test_small_values_are_still_shown_whole() -> None:
    with pytest.raises(ValueError, match=r"got 0\.0001$"):
        check_lease(0.0001)
    with pytest.raises(ValueError, match=r"got -1$"):
        check_timeout(-1)
    with pytest.raises(ValueError, match=r"got 'a\{b'$"):
        check_prefix("a{b")


async def test_public_api_messages_are_short_too(redis: Redis, prefix: str) -> None:
    cases: list[dict[str, Any]] = [{"lease": HUGE}, {"close_timeout": HUGE}, {"fence_ttl": -HUGE}]
    for options in cases:
        with pytest.raises(ValueError, match=r"…$") as caught:
            aiolock.LockManager(redis, prefix=prefix, **options)
        assert len(str(caught.value)) < 160, str(caught.value)
    async with aiolock.LockManager(redis, prefix=prefix) as locks:
        with pytest.raises(ValueError, match=r"…$") as caught:
            locks.lock("x", timeout=-HUGE)
        assert len(str(caught.value)) < 160
        with pytest.raises(ValueError, match=r"…$") as caught:
            await locks.lock("x").acquire(lease=HUGE)
        assert len(str(caught.value)) < 160
