"""The Lua scripts: one operation per ``.lua`` file, a folder per lock kind.

``<kind>/<operation>.lua`` holds one script with a KEYS/ARGV/returns header. Code shared by
every kind lives once at the top level as a prelude (``fence.lua``: the fencing rule;
``tombstone.lua``: the marks releases and undos leave for resent commands), spliced in
where a script says ``--@include <name>``; a prelude includes nothing itself. Each
:class:`Script` carries its final source and SHA1; :mod:`aiolock._client` runs it with
EVALSHA and loads it on NOSCRIPT (a restarted or flushed server forgets scripts).
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources

__all__ = ["REQUIRED_COMMANDS", "Script"]

#: ``--@include fence`` (top level) or ``--@include rw/common`` (a kind's own prelude)
_INCLUDE = re.compile(r"^--@include ([\w/]+)$", re.MULTILINE)


def _read(path: str) -> str:
    return resources.files(__name__).joinpath(path).read_text("utf-8")


class Script:
    """A script of the package, by its path without ``.lua`` (``"lock/acquire"``)."""

    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str) -> None:
        self.name = name
        self.source = _INCLUDE.sub(lambda m: _read(f"{m[1]}.lua"), _read(f"{name}.lua"))
        self.sha = hashlib.sha1(self.source.encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


#: Every Redis command aiolock sends, or calls from its scripts: what an ACL user needs
#: (with ``~<prefix>:*`` keys and ``&<prefix>:*`` channels). Keep in step with the scripts.
REQUIRED_COMMANDS: tuple[str, ...] = (
    # sent by the client
    "evalsha", "script|load", "subscribe", "unsubscribe", "ping", "hello",
    "exists", "hget", "hexists", "pttl",
    # sent by the manager for its identity record (aiolock._identity)
    "set", "del",
    # called from the scripts
    "type", "exists", "get", "set", "hget", "hset", "hexists", "hincrby",
    "pexpire", "pttl", "del", "time", "publish", "pubsub|numsub",
    # called from the scripts of the semaphore and the read-write lock
    "hdel", "hmget", "hlen", "zadd", "zrem", "zrange", "zrangebyscore", "zscore",
    "zcard", "zremrangebyscore",
    # on Redis Cluster: the scripts' sharded variant (aiolock._cluster.sharded), the
    # hub's sharded subscriptions, the slot map and migrations
    "spublish", "pubsub|shardnumsub", "ssubscribe", "sunsubscribe", "cluster|slots",
    "asking",
    # called from the scripts of the redisson wire format (RFencedLock's token counter)
    "incr",
)  # fmt: skip
