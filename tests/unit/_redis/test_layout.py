"""One key layout per prefix (issue 36, item 6): a manager refuses to open beside another.

A manager of the build before ``P:lock:{N}`` and one of today's held one name at once:
their keys differ, so neither excluded the other. Every manager now announces its layout
in its identity record (``l``), and one that opens reads the records under its prefix and
raises :class:`aiolock.IncompatibleLayoutError` if one announces another layout, older or
newer. The other managers' records here are written by :class:`Identity` itself, as a
manager of that layout writes it (only the record of the builds before the field, whose
format is what is tested, is written by hand).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

import aiolock
import aiolock._redis.layout
from aiolock._keys import LAYOUT, identity_key, new_manager_id
from aiolock._redis.client import Client
from aiolock._redis.identity import UNVERSIONED, Identity, layout_of, record
from aiolock._redis.layout import check_layout
from aiolock.testing import RedisServer

#: A lease no test here outlives: the other manager's record must not lapse mid-test.
LONG_LEASE = 600.0


@contextlib.asynccontextmanager
async def manager_of_layout(
    redis: Redis, prefix: str, layout: int, name: str | None = "other-build"
) -> AsyncIterator[Identity]:
    """The identity record of a manager of *layout* on *prefix*, written by the record's
    own code as a manager of that build writes it, deleted on exit (its manager closed)."""
    client = Client(redis)
    identity = Identity(client, identity_key(prefix, new_manager_id()), name, LONG_LEASE, layout)
    try:
        await identity.publish()
        assert await redis.exists(identity.key) == 1, "the record was not written"
        yield identity
    finally:
        await identity.delete()
        await client.aclose()


async def records(redis: Redis, prefix: str) -> list[str]:
    return sorted([key.decode() async for key in redis.scan_iter(match=f"{prefix}:mgr:*")])


@pytest.mark.parametrize(
    ("layout", "direction", "advice"),
    [
        (LAYOUT - 1, "older", "stop every manager of the older build on this prefix"),
        (LAYOUT + 1, "newer", "run this process on the newer build too"),
    ],
)
async def test_a_manager_refuses_to_open_beside_another_layout(
    redis: Redis, prefix: str, layout: int, direction: str, advice: str
) -> None:
    async with manager_of_layout(redis, prefix, layout) as other:
        manager = aiolock.LockManager(redis, prefix=prefix, name="this-build")
        with pytest.raises(aiolock.IncompatibleLayoutError) as caught:
            await manager.open()
        assert not manager.is_open
        # the refused manager wrote its record before it looked, and deleted it again
        assert await records(redis, prefix) == [other.key]
    message = str(caught.value)
    print(message)
    assert message.startswith("the LockManager could not open: "), message
    assert f"other-build@{socket.gethostname()} pid {os.getpid()}" in message, message
    assert f"(aiolock {aiolock.__version__})" in message, message
    assert f"on the prefix {prefix!r}" in message, message
    assert f"announces layout {layout}, {direction} than this build's" in message, message
    assert f"uses layout {LAYOUT}" in message, message
    assert "do not exclude each other" in message, message
    assert advice in message, message
    assert "its record expires within 600.0 s" in message or "599." in message, message
    assert "wire-formats.md" in message, message
    # the other manager's id would let a reader of a log release its holds
    assert other.key.split("{")[1].rstrip("}") not in message, message
    # not open, so it may be opened again: the other manager has closed since
    async with manager, manager.lock("after-the-other-closed"):
        assert manager.is_open


async def test_a_redlock_style_record_of_this_layout_and_an_open_manager_let_it_open(
    redis: Redis, prefix: str
) -> None:
    async with (
        manager_of_layout(redis, prefix, LAYOUT),
        aiolock.LockManager(redis, prefix=prefix) as first,
        aiolock.LockManager(redis, prefix=prefix) as second,
    ):
        assert first.is_open and second.is_open
        assert len(await records(redis, prefix)) == 3


async def test_a_record_written_before_the_field_counts_as_layout_1(
    redis: Redis, prefix: str
) -> None:
    """Records of the builds before issue 36 (today's main) have no ``l``: they are of
    this layout, whose number is 1, and a manager opens beside them."""
    assert LAYOUT == UNVERSIONED == 1  # a bump of LAYOUT makes them another layout
    old = json.dumps(
        {"h": "web-1", "p": 4242, "c": "uvicorn", "v": "0.1.0.dev0", "t": int(time.time())},
        separators=(",", ":"),
    )
    key = identity_key(prefix, new_manager_id())
    await redis.set(key, old, px=60_000)
    try:
        async with aiolock.LockManager(redis, prefix=prefix) as manager:
            assert manager.is_open
    finally:
        await redis.delete(key)
    assert layout_of(json.loads(old)) == 1


def test_the_layout_a_record_announces() -> None:
    assert json.loads(record("app"))["l"] == LAYOUT
    assert json.loads(record(None, 7))["l"] == 7
    assert layout_of({"l": 2}) == 2
    assert layout_of({}) == UNVERSIONED
    for unreadable in ("2", 2.0, True, None, [2]):
        assert layout_of({"l": unreadable}) is None, unreadable


async def test_an_unreadable_layout_refuses_too(redis: Redis, prefix: str) -> None:
    value = json.dumps({"h": "web-9", "p": 9, "c": "worker", "v": "9.0", "l": "2b"})
    key = identity_key(prefix, new_manager_id())
    await redis.set(key, value, px=60_000)
    try:
        with pytest.raises(aiolock.IncompatibleLayoutError, match="cannot read \\('2b'\\)"):
            await aiolock.LockManager(redis, prefix=prefix).open()
    finally:
        await redis.delete(key)


async def test_other_keys_and_other_prefixes_do_not_count(redis: Redis, prefix: str) -> None:
    """Only records under the manager's own prefix count: not another prefix's, not a
    longer prefix's (``P:x``), not one that the glob pattern would match unescaped (``*``),
    and no value aiolock did not write (not JSON, not a string)."""
    glob = f"{prefix}*"
    stray, hashed = identity_key(prefix, new_manager_id()), identity_key(prefix, new_manager_id())
    await redis.set(stray, "not json", px=60_000)
    await redis.hset(hashed, "l", "2")  # a key of another type where a record would be
    await redis.pexpire(hashed, 60_000)
    await redis.set(identity_key(prefix, "not-a-manager-id"), json.dumps({"l": 99}), px=60_000)
    try:
        async with (
            manager_of_layout(redis, f"{prefix}:x", LAYOUT + 1),
            manager_of_layout(redis, f"{prefix}abc", LAYOUT + 1),
        ):
            for each in (prefix, glob):
                async with aiolock.LockManager(redis, prefix=each) as manager:
                    assert manager.is_open
    finally:
        await redis.delete(stray, hashed, identity_key(prefix, "not-a-manager-id"))


async def test_without_its_own_record_a_manager_still_refuses(redis: Redis, prefix: str) -> None:
    async with manager_of_layout(redis, prefix, LAYOUT + 1) as other:
        with pytest.raises(aiolock.IncompatibleLayoutError):
            await aiolock.LockManager(redis, prefix=prefix, identity=False).open()
        assert await records(redis, prefix) == [other.key]


async def test_without_the_open_check_nothing_is_checked(redis: Redis, prefix: str) -> None:
    # check_on_open=False promises no I/O at open: the other layout goes unnoticed (as the
    # docs say), but the record this manager writes at its first round announces its own
    async with (
        manager_of_layout(redis, prefix, LAYOUT + 1),
        aiolock.LockManager(redis, prefix=prefix, check_on_open=False, lease=0.6) as manager,
    ):
        assert manager.is_open


async def test_the_record_is_written_before_the_records_are_read(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Of two managers of different layouts opening at once, one sees the other only if
    each writes before it reads."""
    seen: list[int] = []

    async def looking(client: object, prefix: str, manager_id: str, **options: object) -> None:
        seen.append(await redis.exists(identity_key(prefix, manager_id)))
        await check_layout(client, prefix, manager_id, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(aiolock._redis.layout, "check_layout", looking)
    async with aiolock.LockManager(redis, prefix=prefix):
        pass
    assert seen == [1]


async def test_a_large_database_is_checked_in_part_and_says_so(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # one SCAN call of one key: more keys than that make the check stop short
    monkeypatch.setattr(aiolock._redis.layout, "SCAN_CALLS", 1)
    monkeypatch.setattr(aiolock._redis.layout, "SCAN_COUNT", 1)
    keys = [f"{prefix}:filler:{n}" for n in range(50)]
    await redis.mset(dict.fromkeys(keys, "x"))
    try:
        with caplog.at_level(logging.WARNING, logger="aiolock"):
            async with aiolock.LockManager(redis, prefix=prefix) as manager:
                assert manager.is_open
    finally:
        await redis.delete(*keys)
    assert "checked the identity records of the first 1 keys" in caplog.text, caplog.text
    assert "may have gone unnoticed" in caplog.text


async def test_a_scan_refused_by_an_acl_fails_the_open_and_says_why(prefix: str) -> None:
    # a server of the test's own: the ACL user is not left on the suite's server
    with RedisServer() as server:
        admin = Redis.from_url(server.url)
        await admin.acl_setuser(
            "noscan",
            enabled=True,
            passwords=["+pw-36"],
            keys=["*"],
            channels=["*"],
            commands=["+@all", "-scan"],
        )
        client = Redis(host=server.host, port=server.port, username="noscan", password="pw-36")
        try:
            manager = aiolock.LockManager(client, prefix=prefix)
            with pytest.raises(aiolock.LockPermissionError) as caught:
                await manager.open()
            assert not manager.is_open
            assert await records(admin, prefix) == []  # its record deleted again
        finally:
            await client.aclose()
            await admin.aclose()
    message = str(caught.value)
    print(message)
    assert message.startswith("the LockManager could not open: reading the identity records")
    assert "SCAN" in message, message
