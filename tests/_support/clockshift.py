"""A ``redis-server`` whose wall clock a test can step at run time.

libfaketime (Debian package ``faketime``) would be the usual tool, but it cannot start
Debian's ``redis-server``: that binary is linked with jemalloc, whose initialisation calls
``clock_gettime`` while libfaketime is still resolving its own symbols, and the server dies
with "Cannot recover from unexpected recursive calls to clock_gettime()" (a known,
unfixed clash: libfaketime issues #130, #327, #478).

So this module compiles a tiny ``LD_PRELOAD`` library instead (with the machine's C
compiler, skipping the test when there is none). It overrides ``clock_gettime``,
``gettimeofday`` and ``time`` with direct system calls (no ``dlsym``, no ``malloc``, so
nothing for jemalloc to trip over) and adds, to ``CLOCK_REALTIME`` readings only, an
offset in nanoseconds read from an 8-byte file shared with the test (``mmap``), so a
write to that file steps the server's wall clock at once. ``CLOCK_MONOTONIC`` is left
alone, as an NTP step would leave it.

>>> with ClockShiftedRedisServer() as server:       # doctest: +SKIP
...     server.step(-60.0)                           # the server's clock jumps back 60 s
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from aiolock.testing import RedisServer

__all__ = ["ClockShiftedRedisServer", "build_clockshift", "clockshift_server"]

SOURCE = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile const int64_t *shift_ns;

__attribute__((constructor)) static void clockshift_init(void) {
    const char *path = getenv("CLOCKSHIFT_FILE");
    if (path == NULL) return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    void *map = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map != MAP_FAILED) shift_ns = (volatile const int64_t *)map;
}

static void shift(struct timespec *ts) {
    int64_t ns = shift_ns ? *shift_ns : 0;
    int64_t total = (int64_t)ts->tv_nsec + ns % 1000000000;
    ts->tv_sec += ns / 1000000000 + total / 1000000000;
    total %= 1000000000;
    if (total < 0) { total += 1000000000; ts->tv_sec -= 1; }
    ts->tv_nsec = total;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    long rc = syscall(SYS_clock_gettime, clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) shift(ts);
    return (int)rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    if (tv != NULL) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
"""


def build_clockshift(directory: Path) -> Path | None:
    """Compile the shim into *directory*; ``None`` if there is no C compiler or it fails."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
    library = directory / f"clockshift-{digest}.so"
    if library.exists():
        return library
    source = directory / "clockshift.c"
    source.write_text(SOURCE)
    done = subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(source)],
        capture_output=True,
        check=False,
        timeout=120,
    )
    return library if done.returncode == 0 and library.exists() else None


class ClockShiftedRedisServer(RedisServer):
    """A :class:`RedisServer` under the clock-shift shim; :meth:`step` moves its wall clock."""

    def __init__(self, library: Path, extra_args: Sequence[str] = ()) -> None:
        super().__init__(extra_args)
        self.library = library
        self._shift_dir = tempfile.TemporaryDirectory(prefix="aiolock-clockshift-")
        self.shift_file = Path(self._shift_dir.name) / "shift"
        self.shift_file.write_bytes(struct.pack("<q", 0))
        self.shift = 0.0

    def start(self) -> ClockShiftedRedisServer:
        # The shim and its file reach only the server: the variables are set while it is
        # spawned, and this process never loads the library.
        with _environment(LD_PRELOAD=str(self.library), CLOCKSHIFT_FILE=str(self.shift_file)):
            super().start()
        return self

    def step(self, seconds: float) -> None:
        """Move the server's wall clock by *seconds* (negative: back) from where it is."""
        self.shift += seconds
        with self.shift_file.open("r+b") as file:
            file.write(struct.pack("<q", round(self.shift * 1e9)))

    def stop(self) -> None:
        super().stop()
        self._shift_dir.cleanup()

    def __enter__(self) -> ClockShiftedRedisServer:
        return self.start()


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


@contextlib.contextmanager
def clockshift_server(tmp_dir: Path) -> Iterator[ClockShiftedRedisServer]:
    """A started :class:`ClockShiftedRedisServer`, or a pytest skip saying what is missing."""
    library = build_clockshift(tmp_dir)
    if library is None:
        pytest.skip("no C compiler to build the clock-shift shim for redis-server")
    with ClockShiftedRedisServer(library) as server:
        yield server
