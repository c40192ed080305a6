"""The key naming of ``aiolock._keys``: one Cluster slot per lock, an injective mapping,
and short error messages for absurd durations (issue 7, defects 12 and 13)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.crc import key_slot

import aiolock
from aiolock._keys import (
    KeySpace,
    LockKeys,
    check_lease,
    check_name,
    check_prefix,
    check_timeout,
    new_manager_id,
)
from aiolock.testing import RedisServer

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
