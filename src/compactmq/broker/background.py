"""Stopping the broker's background loops: one way to cancel a task and wait for it to end.

The broker runs a few periodic loops on its event loop (retention, the entry cache's age sweep,
the inactive-topic sweep, the compaction monitor's check). Each is an ``asyncio.Task`` that only
ends when cancelled, so closing one is always the same two steps: cancel it, then await it so
that its ``finally`` blocks run before the broker goes on shutting down. What the task raised on
the way out (the cancellation itself, or an error of its last round, already logged by the loop)
is of no use at shutdown and is swallowed here, once, rather than at every loop's ``close``.
"""

from __future__ import annotations

import asyncio


async def stop_task(task: asyncio.Task | None) -> None:
    """Cancel ``task`` (if any) and wait until it has finished; whatever it raised is dropped."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
