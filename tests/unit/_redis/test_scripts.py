"""Scripts are named by what they do, and errors by the lock they were about (issue 37,
item 4: a log line read "the _kinds/lock/acquire script failed", a path inside the
package, instead of the operation and the lock)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import aiolock
from aiolock._redis.scripts import Script, naming, operation
from tests._support.helpers import closed_port


@pytest.mark.parametrize(
    ("script", "said"),
    [
        ("_kinds/lock/acquire", "acquiring lock"),
        ("_formats/token/release", "releasing lock"),
        ("_kinds/fair/renew", "renewing fair lock"),
        ("_kinds/rw/undo", "undoing an acquisition of read-write lock"),
        ("_kinds/semaphore/set_limit", "setting the limit of semaphore"),
        ("_redlock/extend", "extending redlock"),
    ],
)
def test_a_script_is_named_by_its_operation(script: str, said: str) -> None:
    assert operation(script) == said
    assert Script(script).what == said


def test_the_lock_is_named_from_its_key() -> None:
    assert naming("acquiring lock", "shop:lock:{order:1}") == "acquiring lock 'order:1'"
    assert naming("releasing semaphore", "shop:sem:{pool}:limit") == "releasing semaphore 'pool'"
    assert naming("acquiring lock", "shop:lock:{~}odd}") == "acquiring lock '}odd'"  # escaped
    assert naming("the PING command", None) == "the PING command"
    assert naming("the HGET command", "shop:lock:{a}") == "the HGET command for 'a'"
    # a manager's id never reaches a log line (tests/faults/test_security.py)
    assert naming("the SET command", "shop:mgr:{0123abcd}") == "the SET command"
    assert naming("acquiring lock", "not-ours") == "acquiring lock"


async def test_a_failed_acquire_names_the_operation_and_the_lock(prefix: str) -> None:
    with closed_port() as port:
        # No retries of redis-py's own: with its default ones (seconds against a refused
        # port) the acquire returns only when its attempt does (docs/semantics.md), and
        # the message, not the wait, is what this test is about.
        client = Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0))
        try:
            manager = aiolock.LockManager(client, prefix=prefix, check_on_open=False)
            async with manager as locks:
                with pytest.raises(aiolock.LockConnectionError) as raised:
                    await locks.lock("order:1").acquire(timeout=0.5)
        finally:
            await client.aclose()
    assert "acquiring lock 'order:1'" in str(raised.value), raised.value
    assert "_kinds/" not in str(raised.value)
