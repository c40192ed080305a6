"""The engine: what every lock kind shares (waiting, renewal, loss, release, the body
guard, the hub of waiters, observers) and the seam a kind implements
(:class:`aiolock._engine.kind.LockKind`).

It builds on :mod:`aiolock._redis` and knows no kind, topology or wire format.
"""
