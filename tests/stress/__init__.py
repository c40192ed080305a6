"""The stress tier: multi-process safety runs (the checker is :mod:`tests._support.checker`)."""
