"""The ``redisson`` wire format's lock: Redisson's RLock layout."""
