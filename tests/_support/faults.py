"""Shared helpers of the reliability tests: key prefixes, a logged fenced store, bounded
waits, child processes driven line by line, and the ``AIOLOCK_LONG`` size switch.

Child processes run ``python -m tests._children.faults <mode> '<json>'`` from the
repository root; each is stopped by its own pid (never by name) and every read from it
is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from redis.asyncio import Redis

from tests._support.paths import REPO_ROOT

#: ``AIOLOCK_LONG=1`` selects the big sizes (10,000+ cancellations, more fuzz examples).
LONG = os.environ.get("AIOLOCK_LONG", "") not in ("", "0")

T = TypeVar("T")

#: A fenced store with a write log. KEYS[1] = store hash, KEYS[2] = log list;
#: ARGV[1] = fencing token, ARGV[2] = writer label. A write is accepted when its token is
#: >= the highest accepted so far; every attempt, accepted or not, is appended to the log
#: as "<writer> <token> <1|0>", in the order Redis ran them.
FENCED_LOGGED_WRITE = """
local token = tonumber(ARGV[1])
if token == nil then
  return redis.error_reply('fenced write: token is not a number: ' .. tostring(ARGV[1]))
end
local best = tonumber(redis.call('HGET', KEYS[1], 'token') or '-1')
local ok = 0
if token >= best then
  redis.call('HSET', KEYS[1], 'token', ARGV[1], 'writer', ARGV[2])
  ok = 1
end
redis.call('RPUSH', KEYS[2], ARGV[2] .. ' ' .. ARGV[1] .. ' ' .. ok)
return ok
"""


def unique_prefix(tag: str = "r") -> str:
    """A key prefix no other test uses (tests never flush; they keep to their prefix)."""
    return f"aiolock-{tag}-{uuid.uuid4().hex[:10]}"


def store_keys(prefix: str, name: str) -> tuple[str, str]:
    """The fenced store's hash and log keys for lock *name*, under *prefix*."""
    return f"{prefix}:store:{{{name}}}", f"{prefix}:store-log:{{{name}}}"


async def fenced_write(redis: Redis, prefix: str, name: str, token: int, writer: str) -> bool:
    store, log = store_keys(prefix, name)
    reply = await redis.eval(FENCED_LOGGED_WRITE, 2, store, log, str(token), writer)
    return int(reply) == 1


async def store_log(redis: Redis, prefix: str, name: str) -> list[tuple[str, int, bool]]:
    """The fenced store's log: (writer, token, accepted) in the order Redis ran them."""
    _, log = store_keys(prefix, name)
    entries: list[tuple[str, int, bool]] = []
    for raw in await redis.lrange(log, 0, -1):
        writer, token, ok = (raw.decode() if isinstance(raw, bytes) else str(raw)).split(" ")
        entries.append((writer, int(token), ok == "1"))
    return entries


async def eventually(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Poll *predicate* (sync or async) until true; fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


async def bounded(awaitable: Awaitable[T], seconds: float, what: str) -> T:
    """Await with a hard bound; on expiry fail the test naming *what* hung.

    Runs in the calling task (``asyncio.wait_for`` would wrap a coroutine in a task of its
    own on Python < 3.12, and a lock belongs to the task that acquired it). A
    ``LockTimeoutError`` (a ``TimeoutError``) from *awaitable* itself passes through.
    """
    with anyio.move_on_after(seconds):
        return await awaitable
    raise AssertionError(f"{what} did not finish within {seconds} s")


class Child:
    """A child Python process running one mode of :mod:`tests._children.faults`.

    Its stdout is read line by line (every read bounded); its stderr goes to a temporary
    file shown in failure messages. :meth:`stop` kills it by pid if it still runs.
    """

    #: the module run with ``python -m`` (tests of other kinds bring their own)
    module = "tests._children.faults"

    def __init__(self, mode: str, spec: dict[str, Any]) -> None:
        self.mode = mode
        self.spec = spec
        self.lines: list[str] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self._stderr_text: str | None = None

    async def start(self) -> Child:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]
        )
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self.module,
            self.mode,
            json.dumps(self.spec),
            cwd=str(REPO_ROOT),
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._stderr,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the child was not started"
        return self.proc.pid

    def stderr(self) -> str:
        if self._stderr_text is not None:  # stopped: the file is closed
            return self._stderr_text
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]

    def explain(self) -> str:
        return f"child {self.mode} stdout: {self.lines!r}\nstderr:\n{self.stderr()}"

    async def readline(self, timeout: float) -> str | None:
        """The next stdout line (stripped), or None at EOF."""
        assert self.proc is not None and self.proc.stdout is not None
        try:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(
                f"no output from the child within {timeout} s\n{self.explain()}"
            ) from None
        if not raw:
            return None
        line = raw.decode(errors="replace").rstrip("\n")
        self.lines.append(line)
        return line

    async def expect(self, prefix: str, timeout: float) -> str:
        """Read lines until one starts with *prefix*; return it (bounded in time)."""
        deadline = time.monotonic() + timeout
        while True:
            line = await self.readline(max(0.01, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(
                    f"the child ended before printing {prefix!r}\n{self.explain()}"
                )
            if line.startswith(prefix):
                return line

    async def send(self, data: bytes) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)  # our own child, by its pid

    async def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(
                f"the child did not exit within {timeout} s\n{self.explain()}"
            ) from None

    async def stop(self) -> None:
        """Kill the child by pid if it still runs (SIGKILL also ends a stopped process)."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()
        if self._stderr_text is None:
            self._stderr_text = self.stderr()
            self._stderr.close()


@contextlib.asynccontextmanager
async def children(*made: Child) -> AsyncIterator[tuple[Child, ...]]:
    """Start the children; always stop them (by pid) on the way out."""
    try:
        for child in made:
            await child.start()
        yield made
    finally:
        for child in made:
            await child.stop()
