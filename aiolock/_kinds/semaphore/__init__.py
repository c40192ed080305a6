"""The semaphore: up to ``limit`` permits held at once, each on its own lease."""
