"""``wait_until``: the one polling loop of the test suite.

A test that waits for the broker (a backlog to drain, a compaction status, a file to appear)
states what it waits for as a predicate and a deadline; the loop, the sleep between polls and
the failure message live here. The failure names what was awaited and the last value seen, so a
timeout says more than "assert False".
"""

from __future__ import annotations

import time
from typing import Any, Callable

#: seconds between two polls: short, since most conditions turn true within a few of them
POLL_INTERVAL = 0.05


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 15.0,
    what: str = "condition",
    interval: float = POLL_INTERVAL,
) -> Any:
    """Poll ``predicate`` until it returns a truthy value, and return that value.

    Raises AssertionError after ``timeout`` seconds, naming ``what`` and the last value seen.
    The predicate is always called at least once, and once more at the deadline.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {value!r})")
        time.sleep(interval)
