"""Sharing a few connections among many callers: queued commands go out as pipelines.

:class:`Pipelining` is the base of :class:`~aiolock._redis.client.Client`. It decides what is
sent when, and together with what: at most *max_in_flight* round trips at once, the
commands that find them all busy queued and sent as pipelines, ordered lanes per key
(:meth:`Pipelining.run_in_order`), ``WAIT`` on the connection of the script call it
follows (``replicas=``), and EVALSHA's NOSCRIPT fallback; it settles each caller's
future from the replies. The round trips themselves, on the client's connections, are
:meth:`Pipelining._round_trip`, which the client implements.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple

from redis import exceptions as rex
from redis.exceptions import RedisError

from aiolock._errors import LockConnectionError, LockError
from aiolock._redis.replicas import ACKNOWLEDGE, Acknowledgement
from aiolock._redis.reply import as_text
from aiolock._redis.scripts import Script, naming
from aiolock._redis.translate import translate

__all__ = ["Arg", "Pipelining"]

Arg = str | int | float | bytes


def _chained(error: LockError, cause: BaseException) -> LockError:
    """*error* caused by *cause*, as ``raise error from cause`` would chain it.

    A command settled from a pipeline gets its error through a future, not a ``raise``:
    the cause must be set by hand, because the Redis Cluster router decides on it (a
    MOVED, ASK or TRYAGAIN reply, a connection error) exactly as for a command sent alone.
    """
    error.__cause__ = cause
    return error


class _Request(NamedTuple):
    """A command waiting for a pipeline slot.

    A named tuple made by ``_new_tuple`` (``tuple.__new__``, no Python constructor): one
    is made per queued command, nearly every command under load, and a batch's commands
    and scripts are picked out of them by C-level getters."""

    command: tuple[Arg, ...]
    script: Script | None
    what: str
    key: str | None
    future: asyncio.Future[Any]

    def error(self, exc: rex.RedisError) -> LockError:
        writes = self.script is not None and self.script.writes
        return _chained(translate(exc, self.what, self.key, changes=writes), exc)


#: makes a named tuple from a tuple of its fields, without its constructor (see _Request)
_new_tuple = tuple.__new__
#: a request's command and script (its first two fields), for map() over a batch
_COMMAND = itemgetter(0)
_SCRIPT = itemgetter(1)


class Pipelining:
    """Runs commands on at most *max_in_flight* round trips at once; queues the rest and
    sends it as pipelines (see the module docstring and :class:`~aiolock._redis.client.Client`).
    """

    #: The most commands sent in one pipeline. Small enough that Redis runs one pipeline
    #: while the client reads the replies of another: the tasks that a pipeline's replies
    #: wake send their next commands together, and in one pipeline of them all the client
    #: and Redis took turns instead of working at once. 64 tasks on distinct names ran
    #: 1.3x-1.6x the cycles per second with 16 as with 512 (W2 on one server over
    #: loopback; 256 tasks 1.5x; 16 tasks, whose pipelines are shorter anyway, the same).
    #: With 3 pipelines in flight that is 48 commands per round trip: on a link with a
    #: long round trip, raise the manager's ``max_in_flight``.
    MAX_BATCH = 16

    #: seconds one round trip may take (see Client); None: the connection's own limits
    command_timeout: float | None

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self._in_flight = 0
        #: commands (or a lane's group, sent in one pipeline) waiting for a slot
        self._queue: deque[_Request | list[_Request]] = deque()
        #: ordered lanes (see run_in_order): key -> commands waiting for the lane's turn
        self._lanes: dict[str, deque[_Request]] = {}
        self._flushes: set[asyncio.Task[None]] = set()
        #: the event loop the commands come from, found at the first queued command and
        #: forgotten when the client closes: finding the running loop makes a getpid()
        #: system call on Python 3.10 and 3.11, too dear once per queued command
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Awaitable[Any]:
        """EVALSHA *script*, loading it first if the server does not know it (awaitable).

        A plain function that returns what does the work (see :meth:`_execute`): no
        coroutine layer of its own on a script call, the hot path's main cost being such
        layers.
        """
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        ack = ACKNOWLEDGE.get()
        if ack is not None:  # replicas=: WAIT must follow on the same connection
            return self._acknowledged(command, script, script.what, keys[0] if keys else None, ack)
        key = keys[0] if keys else None
        # _execute and _enqueue, spelled out: every script call under load, when nearly
        # every one is queued, comes through here
        queue = self._queue
        if self._in_flight < self.max_in_flight and not queue:
            return self._send(command, script, script.what, key)
        loop = self._loop
        if loop is None:
            loop = self._event_loop()
        future = loop.create_future()
        queue.append(_new_tuple(_Request, (command, script, script.what, key, future)))
        if self._in_flight < self.max_in_flight:  # (else no slot is free: nothing to send)
            self._kick()
        return future

    async def run_in_order(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """As :meth:`run`, but calls with the same first key reach Redis in call order.

        :meth:`run` lets commands overtake each other: up to *max_in_flight* pipelines
        are in flight on as many connections, and which one Redis reads first is
        chance. A fair lock's queue in Redis is the order its first attempts arrive in,
        so those go through an ordered *lane* per key: while a command of the lane is
        in flight, later ones wait in the lane, and when it is answered they go out
        together, in order, in one pipeline (of at most :attr:`MAX_BATCH`), and so on.
        A lone command pays nothing more than a dict lookup. Under ``replicas=`` (WAIT
        after each grant) commands take :meth:`run`'s path, unordered.
        """
        if ACKNOWLEDGE.get() is not None:
            return await self.run(script, keys, args)
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        what = script.what
        key = keys[0]
        lane = self._lanes.get(key)
        if lane is not None:  # the lane is busy: wait for its turn, behind earlier calls
            future = self._event_loop().create_future()
            request = _new_tuple(_Request, (command, script, what, key, future))
            lane.append(request)
            return await request.future
        self._lanes[key] = deque()
        try:
            return await self._execute(command, script, what, key)
        finally:
            self._next_in_lane(key)

    def _next_in_lane(self, key: str) -> None:
        """The lane's command(s) in flight were answered: send the next group, in order."""
        lane = self._lanes.get(key)
        if lane is None:
            return  # the client closed
        group: list[_Request] = []
        while lane and len(group) < self.MAX_BATCH:
            request = lane.popleft()
            if not request.future.done():  # a cancelled caller's command is dropped
                group.append(request)
        if not group:
            del self._lanes[key]
            return
        left = len(group)

        def settled(_: object) -> None:
            nonlocal left
            left -= 1
            if left == 0:  # every reply of the group is in: the lane's next turn
                self._next_in_lane(key)

        for request in group:
            request.future.add_done_callback(settled)
        self._queue.append(group)
        self._kick()

    async def call(self, *args: Arg, key: str | None = None) -> Any:
        """Send one plain command."""
        return await self._execute(args, None, f"the {as_text(args[0])} command", key)

    async def aclose(self) -> None:
        """Wait for the pipelines in flight; fail what is still queued."""
        lanes, self._lanes = self._lanes, {}
        waiting = [r for lane in lanes.values() for r in lane]
        while self._queue:
            item = self._queue.popleft()
            waiting += item if isinstance(item, list) else (item,)
        for request in waiting:
            if not request.future.done():
                request.future.set_exception(
                    LockConnectionError(
                        f"{naming(request.what, request.key)} was not sent: the manager closed"
                    )
                )
        if self._flushes:
            await asyncio.wait(self._flushes)
        self._loop = None

    def _execute(
        self, command: tuple[Arg, ...], script: Script | None, what: str, key: str | None
    ) -> Awaitable[Any]:
        """*command*'s reply (awaitable): queued at once if every slot is busy, and then
        the caller awaits the request's future itself, without a coroutine of ours in
        between (under load nearly every command is queued); else a coroutine
        that sends it on a free slot when it runs."""
        if self._in_flight >= self.max_in_flight or self._queue:
            # If the caller is cancelled before the flush, the future is cancelled too
            # and the flush skips it: the command is never sent.
            return self._enqueue(command, script, what, key).future
        return self._send(command, script, what, key)

    def _enqueue(
        self, command: tuple[Arg, ...], script: Script | None, what: str, key: str | None
    ) -> _Request:
        # (run() does the same, spelled out)
        loop = self._loop
        if loop is None:
            loop = self._event_loop()
        request = _new_tuple(_Request, (command, script, what, key, loop.create_future()))
        self._queue.append(request)
        if self._in_flight < self.max_in_flight:  # (else no slot is free: nothing to send)
            self._kick()
        return request

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop of the commands (see ``_loop``)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    async def _send(
        self, command: tuple[Arg, ...], script: Script | None, what: str, key: str | None
    ) -> Any:
        # (Decided again when it runs: a slot may have been taken since the call.)
        if self._in_flight < self.max_in_flight and not self._queue:
            self._in_flight += 1
            try:
                return await self._direct(command, script, what, key)
            finally:
                self._in_flight -= 1
                self._kick()
        return await self._enqueue(command, script, what, key).future

    async def _direct(
        self, command: tuple[Arg, ...], script: Script | None, what: str, key: str | None
    ) -> Any:
        try:
            (reply,) = await self._exchange([command], [script])
        except rex.RedisError as exc:
            raise translate(exc, what, key, changes=script is not None and script.writes) from exc
        except TimeoutError as exc:
            raise self._timed_out(naming(what, key)) from exc
        if isinstance(reply, rex.RedisError):
            raise translate(
                reply, what, key, changes=script is not None and script.writes
            ) from reply
        return reply

    async def _acknowledged(
        self,
        command: tuple[Arg, ...],
        script: Script,
        what: str,
        key: str | None,
        ack: Acknowledgement,
    ) -> Any:
        """*command* then WAIT, in one round trip (so on one connection), never coalesced.

        A NOSCRIPT reply loads the script and sends both again: WAIT must follow the
        script call that actually ran.
        """
        commands = [command, ack.policy.wait_command]
        self._in_flight += 1
        try:
            for _ in range(2):
                try:
                    reply, acked = await self._round_trip(commands)
                    if not isinstance(reply, rex.NoScriptError):
                        break
                    (loaded,) = await self._round_trip([("SCRIPT", "LOAD", script.source)])
                    if isinstance(loaded, rex.RedisError):
                        raise loaded
                except rex.RedisError as exc:
                    raise translate(exc, what, key) from exc
                except TimeoutError as exc:
                    raise self._timed_out(naming(what, key)) from exc
        finally:
            self._in_flight -= 1
            self._kick()
        if isinstance(reply, rex.RedisError):
            raise translate(reply, what, key) from reply
        ack.record(acked)
        return reply

    def _kick(self) -> None:
        """Send what is queued, as pipelines, while slots are free."""
        queue = self._queue
        most = self.MAX_BATCH
        while queue and self._in_flight < self.max_in_flight:
            batch: list[_Request] = []
            append = batch.append  # (locals: this loop runs once per queued command)
            while queue and len(batch) < most:
                request = queue.popleft()
                if isinstance(request, list):  # a lane's group: all in this one pipeline
                    if batch and len(batch) + len(request) > most:
                        queue.appendleft(request)  # in the next one
                        break
                    batch += (r for r in request if not r.future.done())
                elif not request.future.done():  # a cancelled caller's command is dropped
                    append(request)
            if not batch:
                return
            self._in_flight += 1
            task = self._event_loop().create_task(self._flush(batch))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _flush(self, batch: list[_Request]) -> None:
        """Send *batch* as one pipeline and settle every caller's future."""
        try:
            replies = await self._exchange([*map(_COMMAND, batch)], [*map(_SCRIPT, batch)])
            for request, reply in zip(batch, replies, strict=True):
                future = request.future
                if future.done():
                    continue
                if isinstance(reply, RedisError):
                    future.set_exception(request.error(reply))
                else:
                    future.set_result(reply)
        except BaseException as exc:
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(self._batch_error(exc, request))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._in_flight -= 1
            self._kick()

    async def _exchange(
        self, commands: list[tuple[Arg, ...]], scripts: Sequence[Script | None]
    ) -> list[Any]:
        """One round trip for *commands*; replies in order, error replies as values.

        A script the server does not know (restart, SCRIPT FLUSH) is loaded and its
        commands are sent again.
        """
        replies = await self._round_trip(commands)
        # (C-level: no Python code runs per reply unless a script must be loaded)
        if not any(map(isinstance, replies, repeat(rex.NoScriptError))):
            return replies
        retry = [
            i
            for i, reply in enumerate(replies)
            if isinstance(reply, rex.NoScriptError) and scripts[i] is not None
        ]
        if retry:
            sources = {scripts[i].sha: scripts[i].source for i in retry}  # type: ignore[union-attr]
            loads: list[tuple[Arg, ...]] = [("SCRIPT", "LOAD", src) for src in sources.values()]
            for reply in await self._round_trip(loads):
                if isinstance(reply, rex.RedisError):
                    raise reply  # e.g. an ACL that forbids SCRIPT LOAD
            again = await self._round_trip([commands[i] for i in retry])
            for i, reply in zip(retry, again, strict=True):
                replies[i] = reply
        return replies

    async def _round_trip(self, commands: list[tuple[Arg, ...]]) -> list[Any]:
        """One round trip for *commands* on one connection; replies in order, error
        replies as values (the client's: see ``Client._round_trip``)."""
        raise NotImplementedError

    def _batch_error(self, exc: BaseException, request: _Request) -> LockError:
        if isinstance(exc, rex.RedisError):
            return request.error(exc)
        if isinstance(exc, TimeoutError):
            return _chained(self._timed_out(naming(request.what, request.key)), exc)
        what = naming(request.what, request.key)
        return _chained(LockConnectionError(f"{what} failed: {exc!r}"), exc)

    def _timed_out(self, what: str) -> LockConnectionError:
        return LockConnectionError(
            f"{what} got no answer from Redis within {self.command_timeout} s (command_timeout)"
        )
