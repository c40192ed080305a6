"""The ``async with`` guard shared by every kind's handle.

Entering records a block with the hold, so that a loss (noticed by the watchdog, a
lease timer or another call) cancels the body; exiting turns that cancellation into
:class:`~aiolock.LockLostError`, or releases the hold. One handle may be entered by many
tasks, and nested in one task.

A block may be held across a ``yield`` (an async generator, a streaming response's
body, a dependency with ``yield``), so two hazards shape it:

* No cancel scope is left on the task while the block is open. An anyio scope entered
  in a generator stays on the task's scope stack while the generator is suspended, and
  the framework's own scopes (a task group around a streaming body) then exit out of
  order: anyio raises "Attempted to exit a cancel scope that isn't the current task's
  current cancel scope". A loss cancels the task natively instead (``task.cancel()``,
  as ``asyncio.timeout`` does), and the exit recognises its own cancellation by a flag
  and, on Python >= 3.11, by the task's cancellation count.
* The exit may run in another task: asyncio finalises an abandoned generator in a task
  of its own, and ``aclose()`` may be awaited anywhere. So a block belongs not to a task
  but to what runs its ``async with`` statement (see :func:`owner_of`): the innermost
  async generator running the code that entered it, else the task. The exit finds the
  block by the same rule, and releases its holds whichever task runs it; it never
  touches another task's cancellation state.

How an exit is matched to its entry: by owner, innermost first. Within one owner the
``async with`` blocks of one handle end in the reverse order of their entries, whatever
wraps them (a user's context manager, ``contextlib.AsyncExitStack``, an
``asynccontextmanager``, a decorator, to any depth): statements nest, an exit stack
unwinds last in first out, and the coroutines between a statement and its owner are
each awaited by one awaiter, so the owner found at the exit is the one found at the
entry. Only two owners' blocks interleave, a generator's and its consumer's (or two
generators'), and they are told apart by owner. No frame is searched to a fixed depth.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Protocol, TypeVar

from aiolock._errors import LockConnectionError, LockError, LockLostError

if TYPE_CHECKING:
    from aiolock._engine.engine import Engine
    from aiolock._engine.kind import Hold

__all__ = [
    "Block",
    "Blocks",
    "BodyGuard",
    "ManagerLike",
    "forget_lost",
    "owner_of",
    "take_back",
    "unmatched_exit",
]

logger = logging.getLogger("aiolock")

#: The ``co_flags`` bit of an async generator's code (``inspect.CO_ASYNC_GENERATOR``).
_ASYNC_GENERATOR = 0x200

#: Seconds between the cancellations a loss sends while its block stays open (see
#: Block._send): short, so that a body whose library swallowed one goes on for no more
#: than this; not zero, so that a body that takes a while to leave costs no busy loop.
RESEND_INTERVAL = 0.005


class ManagerLike(Protocol):
    """What a kind's handle needs from the manager that made it (no import of the manager,
    which imports the handles)."""

    _engine: Engine | None

    @property
    def is_open(self) -> bool: ...

    def _open_engine(self) -> Engine: ...

    def _owner(self) -> str: ...


H = TypeVar("H")


class Block(Generic[H]):
    """One ``async with`` block in progress: its holds, the task and frame that entered it,
    and its owner (see :func:`owner_of`)."""

    __slots__ = (
        "_resend",
        "cancelling",
        "closed",
        "frame",
        "holds",
        "owner",
        "requested",
        "sent",
        "task",
    )

    def __init__(
        self, holds: tuple[H, ...], task: asyncio.Task[Any], frame: FrameType, owner: object
    ) -> None:
        self.holds = holds
        self.task = task
        #: the frame that called ``__aenter__`` (the 'async with' statement's, unless
        #: something wraps the handle)
        self.frame: FrameType | None = frame
        #: the task, or the frame of the async generator, whose blocks this one nests in
        self.owner: object = owner
        #: the task's cancellation count at entry (Python >= 3.11): an exit that finds
        #: it higher after taking back its own cancellations was cancelled from outside too
        self.cancelling = _cancelling(task)
        #: whether a loss has cancelled the task (the hold calls cancel())
        self.requested = False
        #: how many cancellations the loss sent (it sends again until the block exits)
        self.sent = 0
        #: whether the exit has taken the block: nothing is sent any more
        self.closed = False
        self._resend: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        """A hold of the block was lost: cancel the task running the body until it leaves."""
        if self.requested:
            return
        self.requested = True
        self._send()

    def _send(self) -> None:
        # Level-triggered, as anyio's cancel scopes are: the cancellation is sent again
        # every RESEND_INTERVAL until the exit takes the block. A library that swallows a
        # CancelledError (redis-py 8.1 does now and then, inside a command: 26 bodies of
        # 60 ran on after their loss when it was sent once) cannot let the body run on
        # without its lock.
        self._resend = None
        if self.closed or self.task.done():
            return
        self.sent += 1
        self.task.cancel(self.message)
        loop = self.task.get_loop()
        self._resend = loop.call_later(RESEND_INTERVAL, self._send)

    def close(self) -> None:
        """The exit has taken the block: stop sending."""
        self.closed = True
        self.frame = self.owner = None  # no reference cycle through the generator's frame
        if self._resend is not None:
            self._resend.cancel()
            self._resend = None

    @property
    def message(self) -> str:
        """The message of the cancellation a loss sends (Python 3.10 tells it by this)."""
        return f"aiolock: a lock of the 'async with' block {id(self):#x} was lost"


def owner_of(frame: FrameType | None, task: asyncio.Task[Any] | None) -> object:
    """What runs the ``async with`` whose ``__aenter__`` or ``__aexit__`` *frame* called:
    the frame of the innermost async generator among *frame* and the frames awaiting it,
    else *task* (the current one).

    Between *frame* and that generator (or the task's coroutine) each frame is a
    coroutine awaited by the next, and a coroutine is awaited by one awaiter all its
    life: so an entry and its exit, however deeply wrapped, find the same owner. The
    walk stops at the task's own coroutine: above it are the event loop's frames, or,
    for a task started eagerly, the frames of whoever created it.
    """
    root = None if task is None else getattr(task.get_coro(), "cr_frame", None)
    while frame is not None:
        if frame.f_code.co_flags & _ASYNC_GENERATOR:
            return frame
        if frame is root:
            break
        frame = frame.f_back
    return task


class Blocks(Generic[H]):
    """The open ``async with`` blocks of one handle, per owner (see :func:`owner_of`):
    one handle may be entered by many tasks and generators, and nested in each."""

    __slots__ = ("_entered",)

    def __init__(self) -> None:
        # Per owner (a task, or an async generator's frame), its open blocks, innermost last.
        self._entered: dict[object, list[Block[H]]] = {}

    def open(self, holds: tuple[H, ...], caller: FrameType) -> Block[H]:
        """A block of the current task, whose ``__aenter__`` *caller* called."""
        task = asyncio.current_task()
        assert task is not None  # the acquire that made the holds checked
        block = Block(holds, task, caller, owner_of(caller, task))
        self._entered.setdefault(block.owner, []).append(block)
        return block

    def take(self, caller: FrameType) -> Block[H] | None:
        """Remove and return the block that the ``__aexit__`` *caller* called leaves: the
        innermost open block of the caller's owner (one entered by *caller* itself, if
        any: a plain ``async with``). None if that owner has none and the handle has
        more than one open block.
        """
        task = asyncio.current_task()
        if not caller.f_code.co_flags & _ASYNC_GENERATOR:
            stack = self._entered.get(task)
            if stack and stack[-1].frame is caller:  # the common case: a plain 'async with'
                return self._pop(task, len(stack) - 1)
            owner = owner_of(caller, task)
        else:
            owner = caller  # directly in an async generator (an asynccontextmanager's too)
        blocks = self._entered.get(owner)
        if blocks:
            for index in range(len(blocks) - 1, -1, -1):
                if blocks[index].frame is caller:
                    return self._pop(owner, index)
            return self._pop(owner, len(blocks) - 1)
        # Entered and exited by unrelated code in different tasks (a helper that acquires
        # in an endpoint and releases in a response run apart): only the sole open block
        # of this handle can be meant; with several, guessing could release another's.
        if len(self._entered) == 1:
            ((only, blocks),) = self._entered.items()
            if len(blocks) == 1:
                return self._pop(only, 0)
        return None

    def _pop(self, owner: object, index: int) -> Block[H]:
        stack = self._entered[owner]
        block = stack.pop(index)
        block.close()
        if not stack:
            del self._entered[owner]
        return block


class BodyGuard:
    """Cancels ``async with`` bodies whose holds are lost, and releases them on exit.

    A block guards one hold, or several acquired together (a multi-lock): the loss of
    any of them cancels the body.
    """

    __slots__ = ("_blocks",)

    def __init__(self) -> None:
        self._blocks: Blocks[Hold] = Blocks()

    def enter(self, engine: Engine, *holds: Hold) -> bool:
        """Open a block guarding *holds*, which the current task has just acquired; call
        it from the handle's ``__aenter__`` itself, whose caller (the ``async with``
        statement, or what wraps the handle) gives the block's owner.

        False, opening nothing, if one of them is lost already (its lease ended while
        the acquire waited, or before its reply arrived): a block opened now would never
        be cancelled, and the body would run without the lock. The caller then awaits
        :meth:`refuse`.
        """
        registry = engine.registry
        if not all(registry.alive(hold) for hold in holds):
            return False
        block = self._blocks.open(holds, sys._getframe(2))
        for hold in holds:
            hold.scopes.append(block)
        return True

    async def refuse(self, engine: Engine, *holds: Hold) -> NoReturn:
        """Give back *holds*, one of which is lost, and raise :class:`LockLostError`.

        What ``async with`` would have done at exit, before the body ran: the holds still
        held are released (a re-entered one back to its outer count), the lost ones are
        freed in Redis in the background in case Redis still has them.
        """
        lost = [hold for hold in holds if not engine.registry.alive(hold)]
        for hold in lost:
            forget_lost(engine, hold)
        await _release_all(engine, [h for h in holds if h not in lost], quiet=True)
        first = lost[0]
        raise LockLostError(
            f"lock {first.keys.name!r} was lost before the 'async with' body began "
            f"({first.lost_reason}); the body did not run, and nothing is held for it"
        )

    async def exit(
        self,
        handle: object,
        engine: Engine | None,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Leave a block: the innermost of the caller's owner (see :meth:`Blocks.take`);
        call it from the handle's ``__aexit__`` itself. *engine* is None once the
        manager closed."""
        block = self._blocks.take(sys._getframe(2))
        if block is None:
            raise unmatched_exit(handle)
        holds = block.holds
        for hold in holds:
            if block in hold.scopes:
                hold.scopes.remove(block)
        here = block.task is asyncio.current_task()
        ours = here and block.requested and await take_back(block, exc)
        cancelled_from_outside = (
            exc_type is not None and not ours and issubclass(exc_type, asyncio.CancelledError)
        )
        lost = [hold for hold in holds if hold.lost]
        if lost and engine is not None:
            # Whichever way the block ends, its exit is where the loss is settled: the
            # registry forgets it (reported here, or by the cancellation that goes on),
            # and Redis may still have it if renewal was cut off.
            for hold in lost:
                engine.registry.forget_lost(hold)
                engine.release_lost(hold)
        if lost and not cancelled_from_outside:
            if engine is not None:
                await _release_all(engine, [h for h in holds if not h.lost], quiet=True)
            if not here and exc_type is GeneratorExit:
                return  # a generator closed by another task: nobody awaits its outcome
            first = lost[0]
            raise LockLostError(
                f"lock {first.keys.name!r} was lost inside 'async with' ({first.lost_reason}); "
                "the body was cancelled because another owner may have entered"
            ) from (None if ours else exc)
        if engine is None:
            return  # the manager closed meanwhile and released them
        # Cancelled from outside with a hold lost: that cancellation goes on, and the
        # holds still held are released. A hold the body released itself (a semaphore
        # Permit's release()) is no longer registered: releasing it again would find it
        # gone in Redis and report it lost. So is a hold the task-exit safety net
        # released because the task ended with the block still open.
        live = [h for h in holds if not h.lost and engine.registry.holds(h)]
        await _release_all(engine, live, quiet=bool(lost))


def unmatched_exit(handle: object) -> RuntimeError:
    """The error of an ``__aexit__`` that :meth:`Blocks.take` found no block for."""
    return RuntimeError(
        f"{handle!r} was exited by a task (or async generator) that has no 'async with' "
        "block of it open, while several are open elsewhere: call __aenter__ and "
        "__aexit__ from the same task, or the same async generator (an 'async with' does)"
    )


def _cancelling(task: asyncio.Task[Any]) -> int:
    """The task's count of cancellation requests (0 before Python 3.11, which has none)."""
    if sys.version_info >= (3, 11):
        return task.cancelling()
    return 0


async def take_back(block: Block[Any], exc: BaseException | None) -> bool:
    """Withdraw the cancellations a loss sent to *block*'s task; True if *exc* was one.

    The body may have ended before a cancellation reached it (the loss was noticed
    while the task ran, or the body caught it): then it is still pending, and is
    absorbed here rather than let through to the release or to the code after the
    block. A cancellation from outside (the count stays above the entry's) goes on.
    """
    task = block.task
    if isinstance(exc, asyncio.CancelledError):
        if sys.version_info >= (3, 11):
            _withdraw(block)
            return task.cancelling() <= block.cancelling
        # 3.10 has no count: the message tells (a Task.cancel() after ours replaces it,
        # with None when it gives none).
        return bool(exc.args) and exc.args[0] == block.message
    if sys.version_info >= (3, 11):
        if task.cancelling() <= block.cancelling:
            return False  # already taken back (the body caught it and went on)
        _withdraw(block)
    try:
        await asyncio.sleep(0)  # where a pending cancellation of ours lands
    except asyncio.CancelledError:
        if _cancelling(task) > block.cancelling:
            raise  # another one came with it: it goes on
    return False


def _withdraw(block: Block[Any]) -> None:
    """Take back, from the task's count (Python >= 3.11), every cancellation the block
    sent, down to the count at entry: what is left came from outside."""
    if sys.version_info < (3, 11):
        return
    task = block.task
    for _ in range(block.sent):
        if task.cancelling() <= block.cancelling:
            break
        task.uncancel()


def forget_lost(engine: Engine, hold: Hold) -> None:
    """*hold* was lost before its acquire returned: the caller is told so by the error
    it gets, and Redis may still have the hold (a lease ended on the client's clock).

    A re-entered hold (count above one) stays remembered as lost, so the task's outer
    release() or ``async with`` reports the loss too; Redis frees it either way.
    """
    if hold.count <= 1:
        engine.registry.pop_lost(hold.resource, hold.owner)
    engine.release_lost(hold)


async def _release_all(engine: Engine, holds: list[Hold], *, quiet: bool) -> None:
    """Release *holds* in reverse order of acquisition; every one is tried.

    A release that cannot reach Redis is logged, not raised: the body's work is done and
    the release is retried in the background, bounded by the lease (raising here would
    turn finished work into an error, a 503 in a web handler). An explicit release()
    still raises. The first other error is raised once all were tried, unless *quiet*.
    """
    error: LockError | None = None
    cancelled: asyncio.CancelledError | None = None
    for hold in reversed(holds):
        try:
            await engine.release(hold)
        except asyncio.CancelledError as exc_cancel:
            # The engine completed this release despite the cancellation (or handed it to
            # the retrier); the others must be released too: an anyio scope re-delivers
            # its cancellation at every await, so it would otherwise skip all but one.
            cancelled = exc_cancel
        except LockConnectionError as exc_release:
            logger.warning(
                "lock %r: the release after 'async with' could not reach Redis (%s); it "
                "is retried in the background and the lease bounds it meanwhile",
                hold.keys.name,
                exc_release,
            )
        except LockError as exc:
            if error is None:
                error = exc
    if cancelled is not None:
        raise cancelled
    if error is not None and not quiet:
        raise error
