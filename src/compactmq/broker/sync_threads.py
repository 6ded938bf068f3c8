"""The threads that run the topics' syncers: a hand-off to another thread that costs next to
nothing on the event loop.

A topic whose written entries wait for a sync hands ``Topic._sync_in_pool`` to a thread
(``Topic._start_sync``); on a quiet broker that happens for every read of one or two SENDs.
``ThreadPoolExecutor.submit`` builds a ``Future`` (with its ``Condition`` and lock), a work
item and takes a semaphore -- some fifteen Python calls on the loop, and as many in the worker
to settle the future -- for a result nobody reads: the syncer tells the loop itself
(``call_soon_threadsafe``). Here a job is a ``(function, argument)`` pair put on a
``SimpleQueue`` (one C call); each thread takes the next job and runs it.

Threads start on demand, up to ``max_threads`` (the broker's storage thread count: a sync
holds its thread for the fsync, or for an object store's PUT): one more starts whenever more
jobs were handed over than threads could be idle. The count of finished jobs that the loop
reads may lag behind the workers' (each writes its own last figure), so it errs towards
starting a thread early, never towards leaving a job without one. A job must not raise
(``Topic._sync_in_pool`` reports every outcome to the loop); one that does is logged and the
thread goes on.

Inline syncs: a topic with a lone small write may sync it on the loop itself
(``Topic._sync``), saving the two thread hops (the hand-off here, and the report back through
``call_soon_threadsafe``: at 5,000 msg/s, one SEND a sync, those hops were most of a
receipt's time beside the fdatasync). ``claim_inline`` says whether it may: only when no job
waits for or runs in these threads (a busy broker syncs side by side in them) and no other
inline sync ran in this turn of the loop (the loop blocks for at most one sync a turn, so a
thousand quiet topics do not line their syncs up on it). Slow inline syncs (a busy or
network disk: their moving average over ``INLINE_SYNC_SLOW_S``, 1 ms) stop inline syncs for
``INLINE_SYNC_PAUSE_S``, so a slow disk stalls the loop only until the average shows it; a
lone slow sync among quick ones does not (an fdatasync has a long tail even on a quiet disk,
and pausing at each one kept the loop off inline syncs most of the time).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

#: inline syncs whose moving average (the last ~16) is over this pause inline syncs ...
INLINE_SYNC_SLOW_S = 0.001
#: ... for this long (every sync goes to a thread meanwhile)
INLINE_SYNC_PAUSE_S = 1.0

_STOP = None


class SyncThreads:
    def __init__(self, max_threads: int, name: str = "sync") -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self._max = max_threads
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._submitted = 0  # written by the submitting (loop) thread only
        self._finished = itertools.count(1)  # next() is atomic across threads
        self._finished_seen = 0  # a worker's last next(): may lag, never leads
        self._closed = False
        self._inline_turn = False  # an inline sync ran in this loop turn (claim_inline)
        self._inline_paused_until = 0.0  # monotonic time: slow inline syncs (inline_took)
        self._inline_avg_s = 0.0  # moving average of the inline syncs' durations
        self.inline = True  # False: every sync in a thread (tests that hold a sync in flight)

    def claim_inline(self, loop) -> bool:
        """May the caller (on ``loop``) run a sync itself now? See the module docstring."""
        if self._inline_turn or self._submitted != self._finished_seen or not self.inline:
            return False
        if self._inline_paused_until and time.monotonic() < self._inline_paused_until:
            return False
        self._inline_turn = True
        loop.call_soon(self._next_turn)  # runs in the loop's next turn
        return True

    def _next_turn(self) -> None:
        self._inline_turn = False

    def inline_took(self, seconds: float) -> None:
        """An inline sync took ``seconds``: slow ones pause inline syncs (module docstring)."""
        avg = self._inline_avg_s + (seconds - self._inline_avg_s) / 16
        if avg > INLINE_SYNC_SLOW_S:
            self._inline_paused_until = time.monotonic() + INLINE_SYNC_PAUSE_S
            avg = 0.0  # after the pause the disk gets a fresh look
        self._inline_avg_s = avg

    def submit(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Run ``fn(arg)`` in one of the threads."""
        if self._closed:
            raise RuntimeError("sync threads are shut down")
        self._submitted += 1
        self._jobs.put((fn, arg))
        threads = self._threads
        running = len(threads)
        if running < self._max and self._submitted - self._finished_seen > running:
            thread = threading.Thread(target=self._work, name=f"{self._name}-{running}", daemon=True)
            threads.append(thread)
            thread.start()

    def _work(self) -> None:
        jobs, finished = self._jobs, self._finished
        while True:
            job = jobs.get()
            if job is _STOP:
                return
            fn, arg = job
            try:
                fn(arg)
            except BaseException:  # noqa: BLE001 - the thread serves the next job
                log.exception("sync job %r failed", fn)
            # nothing of a finished job stays referenced while the thread waits for the next:
            # its function is a topic's bound method, which would keep an unloaded topic alive
            job = fn = arg = None
            self._finished_seen = next(finished)

    def shutdown(self, timeout: float | None = None) -> None:
        """Let the jobs handed over run to their end, then stop the threads."""
        self._closed = True
        for _ in self._threads:
            self._jobs.put(_STOP)
        for thread in self._threads:
            thread.join(timeout)
