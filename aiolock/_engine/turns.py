"""Turns: a manager that keeps losing the race for a lock asks Redis for its turn.

Which manager's attempt reaches Redis first after a release decides who gets a free lock:
the subscriber Redis tells first, the client nearest to it, the process whose loop is
least busy. The same manager can lose that race every time (issue 36 measured 30 s waits
and a client 15-30 ms further away that never won), and the hub's yield and its bound on
local hand-overs (:mod:`aiolock._engine.hub`) cannot help a manager that is never first.

So a manager whose attempts for a lock found it busy :data:`STARVE_AFTER` times while its
tasks waited asks for a *turn* with every further attempt: Redis appends its id to the
lock's turns (``turns.lua``, for kinds with ``turns``: the reentrant lock), and while any
live turn exists a free lock goes only to the first one's manager, and no release hands
the lock to a local task past another manager's turn. A grant uses the turn up; the
manager's next busy attempt asks again, at the tail, as long as it has waiters. So once a
manager asks, each other manager gets the lock at most once before it does, whatever
the race. The turns cost nothing while nobody starves (one more key read by the acquire
script), and a turn lapses ``claim_ttl`` after its manager stopped refreshing it (it
died): the most a dead waiter can keep a free lock from the others. A manager whose last
waiter gives up gives its turn up at once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiolock._engine.claims import WaiterClaims
    from aiolock._engine.cleanup import Cleanup
    from aiolock._engine.kind import LockKind
    from aiolock._engine.waiter import ChannelQueue
    from aiolock._keys import LockKeys

__all__ = ["REMEMBER", "STARVE_AFTER", "end_turn", "still_starving"]

#: Busy attempts of a manager's waiters on one lock after which its attempts ask for a
#: turn: with one or two managers contending, a manager is first after most releases and
#: never asks; with more, the order of turns replaces the race.
STARVE_AFTER = 3
#: Seconds a manager whose waiters for a lock starved keeps asking for a turn with the
#: first attempt of its next wait (then it races again)
REMEMBER = 1.0


def still_starving(starved: dict[str, float], queue: ChannelQueue) -> None:
    """A wait for *queue*'s lock begins: if the manager's last waiters for it starved less
    than :data:`REMEMBER` s ago, its first attempt asks for a turn (a process with one task
    on a name would otherwise start every wait from scratch, and lose three more races).
    A wait so begun that never finds the lock busy ends the memory (:func:`end_turn`):
    the name's acquisitions take the fast path again."""
    until = starved.get(queue.channel)
    if until is not None:
        if until <= time.monotonic():
            del starved[queue.channel]
        elif not queue.busy:  # (a queue with waiters already counts for itself)
            queue.busy = queue.remembered = STARVE_AFTER


def end_turn(
    claims: WaiterClaims,
    cleanup: Cleanup,
    starved: dict[str, float],
    manager_id: str,
    kind: LockKind,
    keys: LockKeys,
    queue: ChannelQueue,
    got: bool,
) -> None:
    """The last of a manager's waiters for *keys* left (*got*: with the lock): it no longer
    starves for it, and a turn it asked for and did not use is given up (in the
    background, by *cleanup*: the waiter that left does not wait for it). If they
    starved, the next wait asks at once (:func:`still_starving`)."""
    if queue.busy >= STARVE_AFTER and queue.busy > queue.remembered and kind.turns:
        now = time.monotonic()
        if len(starved) > 4096:  # forget those long past
            for channel in [c for c, until in starved.items() if until <= now]:
                del starved[channel]
        starved[queue.channel] = now + REMEMBER
    elif queue.remembered:  # served without finding the lock busy: it starves no more
        starved.pop(queue.channel, None)
    queue.busy = queue.remembered = 0
    if queue.asked:
        queue.asked = False
        claims.discard(kind, keys, manager_id)
        if not got:  # (a grant used the turn up in the same script)
            cleanup.add(
                f"giving up a turn for {keys.name!r}",
                lambda: kind.leave_turn(keys),
                time.monotonic() + kind.claim_ttl,
            )
