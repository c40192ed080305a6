"""Heeding the locks this manager holds: a release it did not make is noticed at once.

A hold can end in Redis without its holder's doing: another client force-releases it
(``aiolock release``, ``force_release()``), or it is deleted, evicted or expired there.
The watchdog finds that at its next renewal or check, a third of a lease later; meanwhile
the holder's body runs beside the new holder's. Every release and force-release of a
lock publishes on its release channel, and a manager already hears the channels its
waiters wait on, so it listens to the channels of the locks it holds too and checks a
hold (one renewal round trip) when a release it did not make is heard there. The body of
a hold found gone is cancelled as for any loss.

Short holds are not listened for: a subscription per acquisition would double the
commands of an uncontended lock. A hold of an exclusive kind is listened for once it
has been held :data:`LISTEN_AFTER` seconds; when its subscription is confirmed it is
checked once, since a release may have come before the subscription.

A deletion, eviction or expiry in Redis publishes nothing: it is still noticed at the
watchdog's next round (or, for an expiry, when the holder's own lease runs out, which by
its clock comes first).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from aiolock._engine.hub import WaiterHub
from aiolock._engine.kind import Hold
from aiolock._engine.registry import HoldRegistry

__all__ = ["LISTEN_AFTER", "ReleaseHeed"]

#: Seconds a hold of an exclusive kind is held before its release channel is listened
#: to: longer than most critical sections (none of which then pays for a subscription),
#: short beside a lease's third, which bounded the notice before.
LISTEN_AFTER = 0.2


class ReleaseHeed:
    """Listens to the release channels of long-held locks; asks for a check on a release.

    *check* is given a hold that a release it did not make may have ended (the watchdog
    checks it with Redis at once).
    """

    def __init__(
        self, registry: HoldRegistry, hub: WaiterHub, check: Callable[[Hold], None]
    ) -> None:
        self._registry = registry
        self._hub = hub
        #: seconds a hold is held before it is listened for (LISTEN_AFTER)
        self.after = LISTEN_AFTER
        self._check = check
        #: (when to listen, hold), in the order the holds were granted (so by time). The
        #: engine appends a hold of an exclusive kind as it registers it, and calls arm()
        #: if no timer is set (inline: the uncontended cycle's every call counts)
        self.due: deque[tuple[float, Hold]] = deque()
        self.timer: asyncio.TimerHandle | None = None
        #: holds listened for: their channel's subscription is this manager's until they end
        self._listened: dict[int, str] = {}
        #: channel -> how many of the listened-for holds are on it (the hub reads it)
        self._held: dict[str, int] = {}
        #: holds listened for since the manager opened (statistics, tests)
        self.listened = 0
        #: checks asked for by a release heard on a held lock's channel
        self.checks = 0
        hub.held = self._held
        hub.on_held_release = self._heard
        registry.on_unheld = self._ended

    def arm(self) -> None:
        if self.timer is None and self.due:
            delay = max(self.due[0][0] - time.monotonic(), 0.0)
            self.timer = asyncio.get_running_loop().call_later(delay, self._listen_due)

    def _listen_due(self) -> None:
        self.timer = None
        due, now = self.due, time.monotonic()
        registry, hub = self._registry, self._hub
        while due and due[0][0] <= now:
            _, hold = due.popleft()
            # (not a hold whose final release is out: that release ends it either way)
            if registry.holds(hold) and hold.release_id is None and id(hold) not in self._listened:
                channel = hold.keys.channel
                self._listened[id(hold)] = channel
                hold.heeded = True
                self.listened += 1
                count = self._held.get(channel, 0)
                self._held[channel] = count + 1
                if not count:
                    hub.hold(channel, hold.kind.queued, hold.kind.anonymous_messages)
        self.arm()

    def _ended(self, hold: Hold) -> None:
        """A listened-for hold ended (released or lost): its subscription is let go,
        unless a waiter of this manager listens there too."""
        channel = self._listened.pop(id(hold), None)
        if channel is None:
            return
        count = self._held.get(channel, 0)
        if count > 1:
            self._held[channel] = count - 1
            return
        self._held.pop(channel, None)
        self._hub.unhold(channel)

    def _heard(self, channel: str) -> None:
        """A release this manager did not make, or a confirmed subscription, on *channel*."""
        hold = self._registry.holding(channel)
        if hold is not None and id(hold) in self._listened:
            self.checks += 1
            self._check(hold)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.due.clear()
        self._held.clear()
        self._listened.clear()
