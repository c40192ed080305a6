"""The door to Redis: transport, client, replies, Cluster routing, Sentinel, replica
acknowledgement, the pub/sub reader, the script loader and read-only inspection.

This layer knows Redis and aiolock's key layout (:mod:`aiolock._keys`), never the engine
or a lock kind (an import-linter contract in ``pyproject.toml`` says so).
"""
