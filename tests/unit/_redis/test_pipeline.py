"""The command layer's pipelines (aiolock/_redis/pipeline.py): concurrent calls share one
connection's round trip, and a failed pipeline reports each call's error as a lone call would."""

from __future__ import annotations

import asyncio

from redis import exceptions as rex
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import aiolock
from aiolock._redis.client import Client
from tests._support.helpers import closed_port


async def test_a_pipeline_failure_keeps_its_cause_as_a_lone_command_does() -> None:
    """What the cluster router decides on (a redirect, a connection error) is the cause
    of the error; a command failed inside a pipeline carries it as a lone one does."""
    with closed_port() as port:
        # nothing listens there; no retries of redis-py's own (its default backs off for
        # seconds per command): the cause, not the retry policy, is what is checked
        redis = Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0))
        client = Client(redis, max_in_flight=1)
        try:
            results = await asyncio.gather(
                *(client.call("EXISTS", f"k{i}", key=f"k{i}") for i in range(5)),
                return_exceptions=True,
            )
        finally:
            await client.aclose()
            await redis.aclose()
    assert client.pipelines >= 1
    for result in results:
        assert isinstance(result, aiolock.LockConnectionError), result
        assert isinstance(result.__cause__, rex.ConnectionError), repr(result.__cause__)
