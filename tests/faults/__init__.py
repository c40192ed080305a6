"""The fault tier: aiolock under network faults, killed connections, restarts and outages.

The tools live in :mod:`tests._support`: :mod:`~tests._support.proxy` (a loopback TCP
proxy a test controls: latency, blackhole, abrupt drops, refused connections, byte
counters), :mod:`~tests._support.servers` (private ``redis-server`` processes with ACL
users or TLS) and :mod:`~tests._support.fault_plugin` (pytest fixtures wrapping both,
active here through this package's ``conftest.py``).

Everything listens on 127.0.0.1 only and every process is stopped by its own pid.
"""
