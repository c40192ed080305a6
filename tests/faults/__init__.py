"""Reusable fault-injection tools for aiolock's reliability tests.

* :mod:`.proxy` -- :class:`~.proxy.FaultProxy`, a loopback TCP proxy a test controls
  (latency, blackhole, abrupt drops, refused connections, byte counters).
* :mod:`.servers` -- private ``redis-server`` processes with ACL users or TLS.
* :mod:`.plugin` -- pytest fixtures wrapping both; enable them with
  ``pytest_plugins = ["tests.faults.plugin"]`` in the root ``tests/conftest.py``
  (they are already active for tests under ``tests/faults/``).

Everything listens on 127.0.0.1 only and every process is stopped by its own pid.
"""
