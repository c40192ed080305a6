"""The Lua script loader: one operation per ``.lua`` file, kept beside the kind that runs it.

A script is named by its path inside the package without ``.lua``
(``"_kinds/lock/acquire"``, ``"_redlock/acquire"``) and holds one script with a
KEYS/ARGV/returns header. Code shared by several kinds (the fencing rule, the release
tombstone, the permit bookkeeping) lives once in ``_kinds/_lua/`` as a prelude, spliced in
where a script says ``--@include <path>`` (``--@include _kinds/_lua/fence``). Each
:class:`Script` carries its final source and SHA1; :mod:`aiolock._redis.client` runs it with
EVALSHA and loads it on NOSCRIPT (a restarted or flushed server forgets scripts).
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources

from aiolock._keys import ESCAPE, IDENTITY_TAG, split_key

__all__ = ["REQUIRED_COMMANDS", "Script", "naming", "operation"]

#: ``--@include _kinds/_lua/fence`` (shared) or ``--@include _kinds/rw/common`` (a kind's own)
_INCLUDE = re.compile(r"^--@include ([\w/]+)$", re.MULTILINE)


#: what each kind's structure is called in errors and logs (by the folder of its scripts)
_NOUNS = {
    "fair": "fair lock",
    "rw": "read-write lock",
    "semaphore": "semaphore",
    "_redlock": "redlock",
}
#: what each script does (by its file name); the rest read "running <name> on"
_VERBS = {
    "acquire": "acquiring",
    "release": "releasing",
    "renew": "renewing",
    "undo": "undoing an acquisition of",
    "extend": "extending",
    "extend_by": "extending",
    "force_release": "force-releasing",
    "refresh": "refreshing the waiters of",
    "probe": "checking",
    "listen": "registering a listener of",
    "detach": "detaching",
    "adopt": "adopting",
    "give_back": "giving back",
    "lease_left": "reading the lease of",
    "keep_turn": "keeping a turn at",
    "look": "reading",
    "set_limit": "setting the limit of",
    "state": "reading",
}


def operation(name: str) -> str:
    """What the script *name* does, as errors and logs say it: ``"_kinds/lock/acquire"``
    -> ``"acquiring lock"``, ``"_kinds/fair/renew"`` -> ``"renewing fair lock"``."""
    *folders, file = name.split("/")
    verb = _VERBS.get(file, f"running {file} on")
    return f"{verb} {_NOUNS.get(folders[-1] if folders else '', 'lock')}"


def naming(what: str, key: str | None) -> str:
    """*what* with the name of the lock whose Redis key is *key*: ``"acquiring lock
    'order:1'"`` (the name is the key's hash tag, unescaped); *what* alone for a key that
    is not a lock's (a format shared with other clients, a manager's identity record)."""
    split = None if key is None or "}" not in key else split_key(key)
    if split is None or split[1] == IDENTITY_TAG:
        return what  # not a lock's key; a manager's id is never written to a log
    name = split[2][1 : split[2].rindex("}")]
    if name.startswith(ESCAPE):
        name = name[1:]
    return f"{what} for {name!r}" if what.startswith("the ") else f"{what} {name!r}"


def _read(path: str) -> str:
    return resources.files("aiolock").joinpath(path).read_text("utf-8")


class Script:
    """A script of the package, by its path without ``.lua`` (``"_kinds/lock/acquire"``)."""

    __slots__ = ("name", "sha", "source", "what", "writes")

    def __init__(self, name: str, *, writes: bool = True) -> None:
        self.name = name
        #: how errors and logs name what it does, "acquiring lock" (made once: the client
        #: passes it along with every call, and :func:`naming` adds the lock's name)
        self.what = operation(name)
        #: False for a script that only reads: its errors then say nothing of undoing
        self.writes = writes
        self.source = _INCLUDE.sub(lambda m: _read(f"{m[1]}.lua"), _read(f"{name}.lua"))
        self.sha = hashlib.sha1(self.source.encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


#: Every Redis command aiolock sends, or calls from its scripts: what an ACL user needs
#: (with ``~<prefix>:*`` keys and ``&<prefix>:*`` channels). Keep in step with the scripts.
REQUIRED_COMMANDS: tuple[str, ...] = (
    # sent by the client
    "evalsha", "script|load", "subscribe", "unsubscribe", "ping", "hello",
    "exists", "hget", "hexists", "pttl", "get",
    # sent by the manager for its identity record (aiolock._redis.identity), and when it
    # opens, to find managers of another key layout (aiolock._redis.layout)
    "set", "del", "scan",
    # called from the scripts
    "type", "exists", "get", "mget", "set", "hget", "hset", "hexists", "hincrby",
    "pexpire", "pttl", "del", "time", "publish", "pubsub|numsub",
    # called from the scripts of the semaphore and the read-write lock
    "hdel", "hmget", "hlen", "zadd", "zrem", "zrange", "zrangebyscore", "zscore",
    "zcard", "zremrangebyscore",
    # on Redis Cluster: the scripts' sharded variant (aiolock._redis.cluster.sharded), the
    # hub's sharded subscriptions, the slot map and migrations
    "spublish", "pubsub|shardnumsub", "ssubscribe", "sunsubscribe", "cluster|slots",
    "asking",
    # called from the scripts of the redisson wire format (RFencedLock's token counter)
    "incr",
)  # fmt: skip
