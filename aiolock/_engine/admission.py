"""The hub's turns: at most :attr:`Admission.WAKES` waiters talk to Redis at once.

A release of N locks wakes N heads, and N heads whose timers run out together (N locks
taken at the same moment) would each talk to Redis at once: their N commands waited in
the client's pipeline queue long enough for CPython's cyclic GC to move them to its
oldest generation, whose full collections walk every waiter (4-5 per release of 20,000).
So a waiter talks to Redis only in a *turn*, of which there are WAKES; the rest wait in
line, in order, and each turn that ends admits the next. The rules, each a method of
:class:`Admission` (the hub's, :attr:`WaiterHub.admission
<aiolock._engine.hub.WaiterHub>`), over the states of :class:`~aiolock._engine.waiter.
WaiterState`:

* :meth:`~Admission.at_once`: a waiter about to attempt gets a turn at once if one is
  free and nobody waits in line (a new waiter's first attempt, the fast path's too);
* :meth:`~Admission.take`: a head whose timer ran out gets one at once the same way, or
  waits in line (a waiter already in line keeps its place);
* :meth:`~Admission.wake`: a wake of a sleeping waiter waits in line for a turn; a wake
  of an awake one is kept for it (``pending``), and one of a waiter in line is its turn;
* :meth:`~Admission.pause`: a waiter about to sleep ends its turn, and a wake it got
  meanwhile (not a hand-over: that needs no attempt) waits in line like any other;
* :meth:`~Admission.admit`: while fewer than WAKES have a turn, the line moves on, in
  order, each waiter woken in its turn;
* :meth:`~Admission.leave`: a waiter that leaves ends its turn, or gives up its place in
  line (the hub passes on the wake it was owed);
* :meth:`~Admission.step_out`: a waiter whose deadline passed in line gives it up.

The fast path's lazy entry holds a turn too (counted in :attr:`~Admission.taken`: see
``WaiterHub.enter`` and ``drop``, which apply ``at_once`` and the end of a turn inline).
"""

from __future__ import annotations

from collections import deque

from aiolock._engine.waiter import DEFERRED, IN_TURN, WAITING, Waiter

__all__ = ["Admission"]


class Admission:
    """The turns of one hub's waiters, and the line of those waiting for one."""

    #: The most waiters in turn at once (until each sleeps again or leaves): 4x the
    #: pipelines' default.
    WAKES = 192

    def __init__(self) -> None:
        #: turns taken: waiters in turn, and the fast path's entries
        self.taken = 0
        #: the waiters in line for a turn, in order (one whose state is no longer
        #: DEFERRED is skipped when it comes up: it stepped out, left, or got its turn)
        self.line: deque[Waiter] = deque()

    def at_once(self, waiter: Waiter) -> bool:
        """Give *waiter* (WAITING) a turn if one is free and nobody waits in line."""
        if self.taken < self.WAKES and not self.line:
            self.taken += 1
            waiter.start_turn()
            return True
        return False

    def take(self, waiter: Waiter) -> bool:
        """*waiter*, a head whose timer ran out, is about to talk to Redis: whether it
        has a turn now. If not, it waits in line (DEFERRED), and :meth:`Waiter.wait`
        returns True in its turn.

        A timer runs out when the holder's lease would end (the quiet wait's probe, or an
        attempt), when a subscription was not confirmed in time (``READY_WAIT``), or after
        a connection error's backoff; the fast path's first attempt of a waiter that
        joined behind others takes a turn the same way. N heads waiting on N locks taken
        at the same moment have their timers run out together: in a turn, they go at most
        WAKES at a time, in the order their timers ran out. A wake that arrived meanwhile
        is taken by that same turn; a waiter whose wake already waits in line keeps its
        place.
        """
        state = waiter.state
        if state is IN_TURN:
            return True
        # A wake that came after the timer (kept as pending) is taken by this turn: the
        # try it makes follows that wake's cause.
        waiter.pending = False
        if state is WAITING:
            if self.at_once(waiter):
                return True
            self._queue_up(waiter)
        if waiter.state is IN_TURN:
            waiter.pending = False  # (admit's wake of a waiter that is not asleep)
            return True
        return False

    def step_out(self, waiter: Waiter) -> None:
        """*waiter* gives up its place in line (its deadline passed while it waited). Its
        turn may have come just as the deadline passed: it keeps it (leave ends it)."""
        if waiter.state is DEFERRED:
            waiter.step_out()

    def wake(self, waiter: Waiter) -> None:
        """Wake *waiter* to try, as one of at most WAKES in turn at once."""
        if waiter.state is DEFERRED:
            return  # it is woken in its turn
        future = waiter._future
        if future is None or future.done():
            waiter.wake()  # awake: it tries once more, in a turn of its own (see pause)
        else:
            self._queue_up(waiter)

    def pause(self, waiter: Waiter) -> None:
        """*waiter* is about to sleep (:meth:`Waiter.wait`): its turn ends, and a wake it
        got meanwhile waits for a turn like any other. A hand-over is never held back: it
        needs no attempt."""
        if waiter.state is IN_TURN:
            waiter.end_turn()
            self.taken -= 1
            self.admit()
        if waiter.pending and waiter.handed is None:
            waiter.pending = False
            self._queue_up(waiter)

    def leave(self, waiter: Waiter) -> bool:
        """*waiter* leaves its queue (LEFT): its turn ends, admitting the next in line;
        whether it left a place in line, which was owed a wake (its entry is skipped)."""
        was = waiter.leave()
        if was is IN_TURN:
            self.taken -= 1
            if self.line:
                self.admit()
        return was is DEFERRED

    def admit(self) -> None:
        """Wake the waiters in line, in order, while fewer than WAKES are in turn."""
        line = self.line
        while line and self.taken < self.WAKES:
            waiter = line.popleft()
            if waiter.state is DEFERRED:  # (not gone, stepped out, nor in turn meanwhile)
                self.taken += 1
                waiter.start_turn()
                waiter.wake()

    def _queue_up(self, waiter: Waiter) -> None:
        waiter.defer()
        self.line.append(waiter)
        self.admit()
