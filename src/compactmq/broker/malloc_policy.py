"""The C allocator's settings for a broker process: few malloc arenas.

glibc's malloc gives each thread that allocates concurrently an arena of its own, up to eight
per core. A broker's thread pool (appends, reads, metadata) allocates entry batches and read
buffers of a few KiB to a few MiB in those threads; freed memory stays in the arena that held
it, and with many arenas the freed pieces are spread thin, rarely whole pages to give back, so
resident memory creeps up under steady load without any Python object staying alive
(``tracemalloc``: the Python heap grew 1.2 MiB while RSS grew 26 MiB in the same soak).
Python objects themselves are unaffected: pymalloc serves everything up to 512 bytes from its
own pools, under the GIL.

So the standalone broker caps malloc at ``ARENAS`` arenas (``mallopt(M_ARENA_MAX)``), before
it starts any thread: the pool's threads then share arenas, whose free memory gets reused.
An operator's ``MALLOC_ARENA_MAX`` in the environment (glibc reads it itself) wins, and
nothing is done on a C library other than glibc.

Only the standalone process applies this (``cli.standalone``); brokers embedded in another
process (tests, tools) leave that process's allocator alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

ARENAS = 2
M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def apply() -> bool:
    """Cap glibc's malloc arenas at ``ARENAS``; True when the cap was set here."""
    if "MALLOC_ARENA_MAX" in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_ARENA_MAX, ARENAS))
    except (OSError, AttributeError):
        return False
