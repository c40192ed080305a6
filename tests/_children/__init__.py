"""Scripts the tests run as child processes (``python -m tests._children.<name>``).

Each is bounded in time by its arguments and prints one event per line, flushed.
"""
