"""The fair lock's kind: a queue of waiters in Redis, granted first come, first served."""
