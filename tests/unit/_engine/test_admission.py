"""The hub's turns (:mod:`aiolock._engine.admission`), one test per rule, on the
:class:`Admission` and its waiters alone: no hub, no Redis.

A waiter "asleep" is one whose task awaits :meth:`Waiter.wait`; a waiter woken in its turn
has that wait return True. WAKES is 2 throughout, so that a third waiter finds none free.
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from aiolock._engine.admission import Admission
from aiolock._engine.kind import Hold
from aiolock._engine.waiter import ChannelQueue, Waiter, WaiterState

WAITING, DEFERRED, IN_TURN, LEFT = (
    WaiterState.WAITING,
    WaiterState.DEFERRED,
    WaiterState.IN_TURN,
    WaiterState.LEFT,
)


@pytest.fixture
def admission() -> Admission:
    admission = Admission()
    admission.WAKES = 2
    return admission


def waiters(n: int) -> list[Waiter]:
    return [Waiter(ChannelQueue(f"c{i}"), f"owner:{i}", None) for i in range(n)]


async def asleep(waiter: Waiter) -> asyncio.Task[bool]:
    """*waiter*'s wait, once it sleeps (its future made)."""
    task = asyncio.ensure_future(waiter.wait(None))
    await asyncio.sleep(0)
    assert waiter._future is not None and not waiter._future.done()
    return task


def test_a_waiter_about_to_attempt_gets_a_turn_at_once_only_if_one_is_free_and_nobody_waits(
    admission: Admission,
) -> None:
    """at_once: a turn while fewer than WAKES are taken and nobody is in line, else none
    (the waiter stays WAITING: it joins the line only by take or a wake)."""
    a, b, c, d = waiters(4)
    assert admission.at_once(a) and admission.at_once(b)
    assert (a.state, b.state, admission.taken) == (IN_TURN, IN_TURN, 2)
    assert not admission.at_once(c)  # WAKES taken
    assert c.state is WAITING and admission.taken == 2
    assert not admission.take(c)  # c waits in line
    admission.WAKES = 3  # a turn free while c waits: still c's, not a newcomer's
    assert not admission.at_once(d) and d.state is WAITING
    admission.WAKES = 2
    admission.pause(a)  # a turn is free, but c comes first: it is c's
    assert c.state is IN_TURN
    admission.pause(b)  # a turn is free and nobody waits: at once
    assert admission.at_once(d) and d.state is IN_TURN
    assert admission.taken == 2


def test_a_head_whose_timer_ran_out_takes_a_turn_or_waits_in_line_keeping_its_place(
    admission: Admission,
) -> None:
    """take: at once if a turn is free, else DEFERRED at the tail of the line; asked again,
    a waiter in line keeps its place (no second entry); a wake kept for it (pending) is
    the one its turn follows."""
    a, b, c, d = waiters(4)
    assert admission.take(a) and admission.take(b)
    assert admission.take(a)  # in turn already
    c.pending = d.pending = True
    assert not admission.take(c) and not admission.take(d)
    assert (c.state, d.state, list(admission.line)) == (DEFERRED, DEFERRED, [c, d])
    assert not c.pending  # its wake is the turn it waits for
    assert not admission.take(d)
    assert list(admission.line) == [c, d]  # d kept its place, behind c
    admission.pause(a)
    assert (c.state, d.state) == (IN_TURN, DEFERRED)  # in the order they came
    assert admission.take(c) and admission.taken == 2


async def test_a_wake_of_a_sleeper_waits_for_a_turn_an_awake_waiter_keeps_it(
    admission: Admission,
) -> None:
    """wake: a sleeping waiter is woken in a turn (at once if one is free, else in line,
    once); an awake one keeps the wake (pending); one in line is not woken twice."""
    a, b, c, d = waiters(4)
    assert admission.at_once(a) and admission.at_once(b)
    sleeping = await asleep(c)
    admission.wake(c)
    assert c.state is DEFERRED and not sleeping.done()  # no turn free: in line
    admission.wake(c)
    assert list(admission.line) == [c]  # woken in its turn, once
    admission.wake(d)  # awake (not in wait()): kept for its next wait
    assert d.pending and d.state is WAITING
    admission.pause(a)
    assert await sleeping is True and c.state is IN_TURN
    admission.pause(b)
    sleeping = await asleep(b)
    admission.wake(b)  # a turn is free: woken at once, in it
    assert await sleeping is True and b.state is IN_TURN and admission.taken == 2


async def test_a_waiter_about_to_sleep_ends_its_turn_and_a_wake_it_got_waits_in_line(
    admission: Admission,
) -> None:
    """pause: the turn ends (admitting the next in line), and a wake kept for the waiter
    (pending) waits in line for a turn, unless it brought a hand-over (none needed)."""
    a, b, c = waiters(3)
    assert admission.at_once(a) and admission.at_once(b)
    assert not admission.take(c)
    a.pending = True  # woken while it attempted
    admission.pause(a)  # c gets a's turn; a's wake waits behind it
    assert (a.state, c.state, admission.taken) == (DEFERRED, IN_TURN, 2)
    assert not a.pending and list(admission.line) == [a]
    admission.pause(b)
    assert a.state is IN_TURN and b.state is WAITING
    b.give(cast(Hold, object()))  # a hand-over's wake: it needs no attempt
    assert b.pending
    admission.pause(b)
    assert b.pending and b.state is WAITING and not admission.line
    assert admission.taken == 2  # a's and c's


async def test_the_line_moves_in_order_while_fewer_than_wakes_have_a_turn(
    admission: Admission,
) -> None:
    """admit: each turn that ends wakes the next waiter in line (one turn, one waiter),
    in the order they queued; a waiter that stepped out or left is skipped."""
    a, b, c, d, e, f = waiters(6)
    assert admission.take(a) and admission.take(b)
    tasks = {w: await asleep(w) for w in (c, d, e, f)}
    for w in (c, d, e, f):
        admission.wake(w)
    assert list(admission.line) == [c, d, e, f]
    admission.step_out(d)
    assert admission.leave(e)  # (owed: its place in line had a wake)
    admission.pause(a)
    assert c.state is IN_TURN and f.state is DEFERRED and admission.taken == 2
    assert await tasks[c] is True
    admission.pause(b)  # d and e are skipped: f's turn
    assert f.state is IN_TURN and await tasks[f] is True
    assert (d.state, e.state) == (WAITING, LEFT) and not admission.line
    assert not tasks[d].done()
    tasks[d].cancel()


def test_a_waiter_that_leaves_ends_its_turn_or_gives_up_its_place_in_line(
    admission: Admission,
) -> None:
    """leave: LEFT for good; a turn it had goes to the next in line; whether it left a
    place in line (whose wake the hub passes on)."""
    a, b, c, d = waiters(4)
    assert admission.take(a) and admission.take(b)
    assert not admission.take(c) and not admission.take(d)
    assert admission.leave(a) is False  # it had a turn: c's now
    assert (a.state, c.state, admission.taken) == (LEFT, IN_TURN, 2)
    assert admission.leave(d) is True  # owed: its place in line
    assert d.state is LEFT
    admission.pause(b)
    assert admission.taken == 1 and not admission.line  # d's entry skipped
    e = waiters(1)[0]
    assert admission.leave(e) is False and admission.taken == 1  # WAITING: nothing owed


def test_a_waiter_whose_deadline_passed_in_line_steps_out(admission: Admission) -> None:
    """step_out: DEFERRED -> WAITING, its entry skipped; a waiter whose turn came just as
    its deadline passed keeps it (leave ends it)."""
    a, b, c = waiters(3)
    assert admission.take(a) and admission.take(b)
    assert not admission.take(c)
    admission.step_out(c)
    assert c.state is WAITING
    admission.pause(a)
    assert c.state is WAITING and admission.taken == 1  # skipped: the turn stays free
    admission.step_out(b)
    assert b.state is IN_TURN  # in turn: kept


def test_a_waiter_state_changes_only_from_where_it_may() -> None:
    """The transitions check their starting state (asserts: a hot object)."""
    (w,) = waiters(1)
    with pytest.raises(AssertionError):
        w.end_turn()  # WAITING
    with pytest.raises(AssertionError):
        w.step_out()
    w.defer()
    with pytest.raises(AssertionError):
        w.defer()  # DEFERRED already
    w.start_turn()
    with pytest.raises(AssertionError):
        w.start_turn()
    assert w.leave() is IN_TURN
    with pytest.raises(AssertionError):
        w.leave()
    with pytest.raises(AssertionError):
        w.reserve()  # gone: nobody hands it anything
