"""The reentrant lock: its handle, its kind, its scripts, and the hand-off between tasks."""
