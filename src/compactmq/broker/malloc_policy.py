"""The C allocator's settings for a broker process: few malloc arenas, freed memory given back.

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

Freed memory given back (``trim``). Even with few arenas, glibc returns freed memory to the
system only from the top of its heap; a long-lived allocation above a stretch of freed memory
(a topic's objects made after a burst of reads, say) pins all of it. So after a round of fresh
topics the broker's Python and C objects are back where they were, but its resident memory is
not: ``bench/memory_trace.py --rounds`` (200 k messages a topic) measured RSS 98 -> 121 MiB
over eight rounds with RSS after ``malloc_trim(0)`` at 83-99 MiB, Python's blocks flat and at
most 8 managed ledgers open (``pulsar_ml_count``). ``malloc_trim(0)`` hands every free page of
every arena back (``madvise``), wherever it sits; the pages are reused on the next allocation,
at the cost of a page fault. The inactive-topic sweep calls ``trim`` after it unloaded or
deleted topics (the moment a broker has just freed a topic's worth of memory), so a broker
that serves a stream of new topics stays flat instead of keeping each round's high-water mark.

Large blocks in their own mappings (``MMAP_THRESHOLD``). glibc serves a block of 128 KiB or
more from a mapping of its own, unmapped when freed; but each time it frees such a block it
raises that threshold to the block's size (up to 32 MiB), so after the first few, buffers of
MiBs come from the heap and stay resident once freed. A ledger's seal encodes its index (16 bytes
an entry: MiBs for a busy topic) into one buffer and frees it, and a read batch can be MiBs: the
10-minute soak's first rollover left tens of MiB resident. Setting the threshold (1 MiB) turns
the adjustment off, so such blocks go back to the system as soon as they are freed; smaller
ones (socket buffers, 256 KiB) stay in the heap and are reused. ``MALLOC_MMAP_THRESHOLD_`` in
the environment wins.

Only the standalone process applies this (``cli.standalone``); brokers embedded in another
process (tests, tools) leave that process's allocator alone: ``trim`` does nothing there
unless ``apply`` ran (or ``TRIM_ENABLED`` is set).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

ARENAS = 2
M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
M_MMAP_THRESHOLD = -3
#: blocks this large or larger get their own mapping, given back to the system when freed
MMAP_THRESHOLD = 1 << 20


#: whether ``trim`` gives memory back in this process (set by ``apply``: the standalone broker)
TRIM_ENABLED = False
#: how many times ``trim`` ran malloc_trim (tests and benchmarks read it)
trims = 0


@functools.lru_cache(maxsize=1)
def _libc():
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def apply() -> bool:
    """Cap glibc's malloc arenas at ``ARENAS`` and let ``trim`` work; True when the cap was
    set here (an operator's ``MALLOC_ARENA_MAX`` wins, the trims happen all the same)."""
    global TRIM_ENABLED
    libc = _libc()
    if libc is None:
        return False
    TRIM_ENABLED = True
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        return bool(libc.mallopt(M_ARENA_MAX, ARENAS))
    except AttributeError:
        return False


def trim() -> bool:
    """``malloc_trim(0)``: give every free page of the C heap back to the system (see the module
    notes). Blocking (milliseconds for a heap of a few hundred MiB): call it in a worker thread.
    True when memory was released; False when nothing was, or trimming is off here."""
    global trims
    if not TRIM_ENABLED:
        return False
    libc = _libc()
    if libc is None:
        return False
    trims += 1
    return bool(libc.malloc_trim(0))
