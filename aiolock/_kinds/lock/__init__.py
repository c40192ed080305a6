"""The reentrant lock (and the fair lock's handle, which is a lock granted in queue order)."""
