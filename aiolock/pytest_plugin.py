"""A pytest plugin for applications that use aiolock: a Redis to test against, and managers.

Installed with aiolock (entry point ``pytest11``, name ``aiolock``), so pytest loads it by
itself; ``-p no:aiolock`` turns it off. Fixtures (all named ``aiolock_*``, so they never
clash with a project's own ``redis_url`` or ``locks``):

* ``aiolock_redis_url`` (session): the URL of a Redis to test against. ``--aiolock-redis-url``
  or ``$AIOLOCK_REDIS_URL`` name one of yours; otherwise a throwaway ``redis-server`` is
  started on a free loopback port (:class:`aiolock.testing.RedisServer`) the first time a
  test asks for it, and stopped by pid at the end of the session.
* ``aiolock_prefix``: a key prefix of the test's own, so tests share no keys and nothing
  needs flushing.
* ``aiolock_manager``: an open :class:`aiolock.LockManager` on that Redis with that prefix,
  closed after the test. An async fixture, run by pytest-asyncio in ``auto`` and in
  ``strict`` mode (it is declared with ``pytest_asyncio.fixture``).

See docs/testing.md.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar, cast

import pytest

from aiolock import LockManager
from aiolock.testing import RedisServer, RedisServerError

__all__ = ["ENV_VAR", "aiolock_manager", "aiolock_prefix", "aiolock_redis_url"]

#: The environment variable naming a Redis to use instead of a throwaway server.
ENV_VAR = "AIOLOCK_REDIS_URL"

F = TypeVar("F", bound=Callable[..., Any])


def _async_fixture(function: F) -> F:
    """Declare an async fixture with pytest-asyncio, if it is installed.

    Strict mode runs only fixtures declared with ``pytest_asyncio.fixture``; auto mode
    runs them too. Without pytest-asyncio it is a plain fixture: the anyio plugin can
    run it, and pytest explains itself when no plugin can.
    """
    try:
        import pytest_asyncio
    except ImportError:  # pragma: no cover - the plugin must load without pytest-asyncio
        return cast(F, pytest.fixture(function))
    return cast(F, pytest_asyncio.fixture(function))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aiolock", "aiolock: distributed locks on Redis")
    group.addoption(
        "--aiolock-redis-url",
        default=None,
        help=f"Redis URL for the aiolock_* fixtures (default: ${ENV_VAR}, else a "
        "throwaway redis-server started for the session)",
    )


@pytest.fixture(scope="session")
def aiolock_redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis URL for the session: yours if given, else a throwaway ``redis-server``'s."""
    explicit = request.config.getoption("--aiolock-redis-url") or os.environ.get(ENV_VAR)
    if explicit:
        yield explicit
        return
    try:
        server = RedisServer().start()
    except RedisServerError as exc:
        pytest.fail(
            f"aiolock_redis_url: {exc}; or name a Redis to test against with "
            f"--aiolock-redis-url or ${ENV_VAR}",
            pytrace=False,
        )
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def aiolock_prefix() -> str:
    """A key prefix of this test's own (``aiolock-test-<12 hex>``)."""
    return f"aiolock-test-{uuid.uuid4().hex[:12]}"


@_async_fixture
async def aiolock_manager(
    aiolock_redis_url: str, aiolock_prefix: str
) -> AsyncIterator[LockManager]:
    """An open LockManager on ``aiolock_redis_url`` with ``aiolock_prefix``, closed after."""
    async with LockManager.from_url(aiolock_redis_url, prefix=aiolock_prefix) as manager:
        yield manager
