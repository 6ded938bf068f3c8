"""The cyclic garbage collector's settings for a broker process.

CPython's cyclic collector runs a young-generation pass every 700 net allocations of
container objects and, every 100 of those, a full pass over *every* tracked object. A broker
publishing tens of thousands of messages a second allocates a few such objects per message (the
decoded SEND, its pending receipt, the append queue's tuple), and keeps up to the clients'
pending windows of them alive at once: full passes then walk 150,000+ objects several times a
second. Measured with the official client (50k x 100 B, batching off), the collector took about
a third of the broker's CPU: 20 us of CPU per published message with the defaults, 12.6 us with
the startup heap frozen, 10-11 us with a larger young generation too (bench figures in the
commit that added this module).

So, once the broker has started (its modules, config and services are long-lived):

* ``gc.freeze()`` moves everything allocated so far to the permanent generation, which no pass
  walks again;
* the young generation holds ``YOUNG_THRESHOLD`` objects before a pass (a few MB of garbage at
  most wait for it; nearly all per-message objects are freed by reference counting anyway),
  and the older generations are visited less often (``OLDER_THRESHOLDS``).

Only the standalone process applies this (``cli.standalone``); brokers embedded in another
process (tests, tools) leave that process's collector alone.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000
OLDER_THRESHOLDS = (20, 20)


def apply() -> None:
    """Freeze the heap as it is now and set the broker's thresholds."""
    gc.collect()  # what startup left as garbage is freed, not frozen
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
