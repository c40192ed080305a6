"""The Lua scripts, one operation per ``.lua`` file, loaded once from the package.

Each :class:`Script` carries its source and SHA1; :mod:`aiolock._client` runs it with
EVALSHA and loads it on NOSCRIPT (a restarted or flushed server forgets scripts).
"""

from __future__ import annotations

import hashlib
from importlib import resources

__all__ = [
    "ACQUIRE",
    "CANCEL",
    "FORCE_RELEASE",
    "RELEASE",
    "RENEW",
    "REQUIRED_COMMANDS",
    "Script",
]


class Script:
    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str) -> None:
        self.name = name
        self.source = resources.files(__name__).joinpath(f"{name}.lua").read_text("utf-8")
        self.sha = hashlib.sha1(self.source.encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


ACQUIRE = Script("acquire")
RELEASE = Script("release")
RENEW = Script("renew")
CANCEL = Script("cancel")
FORCE_RELEASE = Script("force_release")


#: Every Redis command aiolock sends, or calls from its scripts: what an ACL user needs
#: (with ``~<prefix>:*`` keys and ``&<prefix>:*`` channels). Keep in step with the scripts.
REQUIRED_COMMANDS: tuple[str, ...] = (
    # sent by the client
    "evalsha", "script|load", "subscribe", "unsubscribe", "ping", "hello",
    "exists", "hget", "hexists", "pttl",
    # called from the scripts
    "type", "exists", "hget", "hmget", "hset", "hdel", "hexists", "hincrby",
    "pexpire", "pttl", "del", "set", "time", "publish", "pubsub|numsub",
)  # fmt: skip
