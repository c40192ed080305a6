"""Helpers shared by the test tiers: servers, proxies, clients that count, checkers.

Nothing here is collected as a test. Child-process scripts live in :mod:`tests._children`.
"""
