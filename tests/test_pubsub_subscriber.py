"""The one pub/sub reader loop (aiolock._redis.pubsub.Subscriber) on its own, against a server."""

from __future__ import annotations

from collections.abc import Collection

import anyio
from redis.asyncio import Redis

from aiolock._redis.pubsub import Subscriber, SubscriptionEvents

from .helpers import eventually


class Recorder(SubscriptionEvents):
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def on_message(self, channel: str, data: str) -> None:
        self.events.append(("message", (channel, data)))

    def on_confirmed(self, channel: str) -> None:
        self.events.append(("confirmed", channel))

    def on_unconfirmed(self, channel: str) -> None:
        self.events.append(("unconfirmed", channel))

    def on_dropped(self, channel: str) -> None:
        self.events.append(("dropped", channel))

    def on_lost(self, channels: Collection[str]) -> None:
        self.events.append(("lost", frozenset(channels)))

    def count(self, event: tuple[str, object]) -> int:
        return self.events.count(event)


async def test_a_subscriber_follows_its_wanted_set_and_survives_a_killed_connection(
    redis: Redis, admin: Redis, prefix: str
) -> None:
    one, two = f"{prefix}:one", f"{prefix}:two"
    seen = Recorder()
    subscriber = Subscriber(redis, seen)
    async with anyio.create_task_group() as tg:
        tg.start_soon(subscriber.run)
        subscriber.want(one)
        subscriber.want(two)
        await eventually(lambda: seen.count(("confirmed", two)) == 1, what="confirmations")
        await admin.publish(one, "hello")
        await eventually(lambda: ("message", (one, "hello")) in seen.events, what="message")

        # A killed connection: both channels reported lost, then subscribed again.
        await admin.client_kill_filter(_type="pubsub")
        await eventually(lambda: ("lost", frozenset({one, two})) in seen.events, what="lost")
        await eventually(lambda: seen.count(("confirmed", two)) == 2, what="resubscribed")
        assert subscriber.tally.reconnects >= 1 and subscriber.tally.losses >= 1

        # No longer wanted: unsubscribed, then reported dropped; the other one stays.
        examined = subscriber.tally.examined
        subscriber.unwant(one)
        await eventually(lambda: ("dropped", one) in seen.events, what="dropped")
        assert ("unconfirmed", one) in seen.events
        assert subscriber.tally.examined - examined == 1  # only what changed is looked at
        assert not subscriber.subscribed(one) and subscriber.subscribed(two)
        await eventually(lambda: not subscriber.listening(one), what="the unsubscription")
        tg.cancel_scope.cancel()
