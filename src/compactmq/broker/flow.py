"""Flow control, both ways, in two small classes.

``PermitWindow`` is a consumer's credit: the client grants permits with FLOW (counted in
messages, a batch entry costs as many permits as it holds messages) and the broker may only
dispatch while the window is open. Like Pulsar, a whole batch entry is sent when at least one
permit is left, so the window may go briefly negative; it never lets a consumer get ahead of
what it asked for by more than one entry.

``ReadPauser`` is the producer side: bytes a connection has sent but storage has not yet
persisted are counted; above the high-water mark the socket stops being read (TCP then slows the
client down), below the low-water mark reading resumes. Nothing is buffered without bound.
It also *holds* a busy producer connection's reads apart: once a connection's plain SENDs
arrive faster than ``BUSY_READ_RATE`` (counted over ``BUSY_WINDOW_S``), each read of them is
followed by a pause of the group-commit delay (``managedLedgerGroupCommitMaxDelayMicros``, the
spacing of a busy topic's syncs), so the next read takes what arrived meanwhile in one go. At
19 k msg/s a read then takes ~20 SENDs instead of ~5, and the broker pays the wake-up, the read,
the write to the ledger and the loop turn a fifth as often (at 12,000 msg/s the broker's CPU per
message fell from 37.6 to 30.3 us, publish p50 1.4-2.3 -> 1.9-3.0 ms). A message the hold keeps
in the socket would mostly have waited for the topic's next spaced sync anyway; below that rate
(a lone producer at 5,000 msg/s, a producer that waits for each receipt) reads are never held.
Every read of a connected producer counts its SENDs, whichever path decoded them: the whole run
of the fast path, and a read that ends inside a frame or starts with one's rest (the common read
of a loaded machine). Both pauses are kept apart: reading resumes only when neither holds it.
The hold runs on the loop's timer, which under uvloop counts whole milliseconds: a delay under
1 ms holds a read for about one loop turn.
"""

from __future__ import annotations

from ..errors import InvalidInput
from ..storage.group_commit import group_delay_seconds

# FLOW carries a uint32; a client asking for more than this in total is broken or hostile.
MAX_PERMITS = 2**31 - 1

# A connection whose SENDs arrive faster than this many a second, counted over windows of
# BUSY_WINDOW_S, has its reads held apart (ReadPauser.after_sends). The same rate as the topic's
# sync spacing (storage.group_commit.BUSY_SYNC_RATE): below it a read is handled at once.
BUSY_READ_RATE = 10_000.0
BUSY_WINDOW_S = 0.05


def read_hold_seconds(config) -> float:
    """How long a busy producer connection's reads are held apart (``ReadPauser.after_sends``):
    the group-commit delay its topic's syncs are spaced by, when appends are synced at all."""
    return group_delay_seconds(config) if config["managedLedgerSyncData"] else 0.0


class PermitWindow:
    """Message permits granted by one consumer (the model is h2's flow-control window)."""

    __slots__ = ("available",)

    def __init__(self) -> None:
        self.available = 0

    def grant(self, permits: int) -> None:
        if permits < 0:
            raise InvalidInput(f"FLOW with negative permits {permits}")
        self.available = min(self.available + permits, MAX_PERMITS)

    @property
    def is_open(self) -> bool:
        return self.available > 0

    def consume(self, messages: int) -> None:
        """Account for one dispatched entry holding ``messages`` messages."""
        self.available -= max(1, messages)

    def restore(self, messages: int) -> None:
        """Give back permits for an entry that was taken but not sent."""
        self.available = min(self.available + max(1, messages), MAX_PERMITS)

    def reset(self) -> None:
        self.available = 0

    def __repr__(self) -> str:
        return f"PermitWindow({self.available})"


class ReadPauser:
    """Pause reading a transport while too many published bytes wait for storage (``add``,
    ``release``); and hold a busy connection's reads ``hold_s`` apart (``after_sends``), on
    ``loop``'s timer. ``paused`` and ``held`` are the two reasons; reading resumes when
    neither holds. ``holds`` counts the holds (for tests and benchmarks)."""

    __slots__ = (
        "_transport",
        "high_water",
        "low_water",
        "pending",
        "paused",
        "held",
        "_loop",
        "_hold_s",
        "_window_start",
        "_window_sends",
        "busy",
        "holds",
    )

    def __init__(self, transport, high_water: int, loop=None, hold_s: float = 0.0) -> None:
        self._transport = transport
        self.high_water = max(1, high_water)
        # Resume at half: avoids flapping pause/resume on every single append.
        self.low_water = self.high_water // 2
        self.pending = 0
        self.paused = False
        self.held = False
        self._loop = loop
        self._hold_s = hold_s if loop is not None else 0.0
        self._window_start = 0.0
        self._window_sends = 0
        self.busy = False
        self.holds = 0

    @property
    def stopped(self) -> bool:
        """Reading is stopped for either reason (backpressure or a hold)."""
        return self.paused or self.held

    def add(self, nbytes: int) -> None:
        self.pending += nbytes
        if not self.paused and self.pending > self.high_water:
            self.paused = True
            if not self.held:
                self._transport.pause_reading()

    def release(self, nbytes: int) -> None:
        self.pending -= nbytes
        if self.paused and self.pending <= self.low_water:
            self.paused = False
            if not self.held and not self._transport.is_closing():
                self._transport.resume_reading()

    def after_sends(self, now: float, sends: int) -> None:
        """A read of ``sends`` plain SENDs was handled at ``now`` (the loop's time): count
        them, and hold reading for ``hold_s`` when the connection is busy (module docstring).
        Whether it is busy is judged once a window, from the window before."""
        if not self._hold_s:
            return
        counted = self._window_sends + sends
        elapsed = now - self._window_start
        if elapsed >= BUSY_WINDOW_S:
            self.busy = counted >= BUSY_READ_RATE * elapsed
            self._window_start = now
            counted = 0
        self._window_sends = counted
        if self.busy and not self.held:
            self.held = True
            self.holds += 1
            if not self.paused:
                self._transport.pause_reading()
            self._loop.call_later(self._hold_s, self._end_hold)

    def _end_hold(self) -> None:
        self.held = False
        if not self.paused and not self._transport.is_closing():
            self._transport.resume_reading()
