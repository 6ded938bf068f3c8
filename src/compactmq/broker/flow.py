"""Flow control, both ways, in two small classes.

``PermitWindow`` is a consumer's credit: the client grants permits with FLOW (counted in
messages, a batch entry costs as many permits as it holds messages) and the broker may only
dispatch while the window is open. Like Pulsar, a whole batch entry is sent when at least one
permit is left, so the window may go briefly negative; it never lets a consumer get ahead of
what it asked for by more than one entry.

``ReadPauser`` is the producer side: bytes a connection has sent but storage has not yet
persisted are counted; above the high-water mark the socket stops being read (TCP then slows the
client down), below the low-water mark reading resumes. Nothing is buffered without bound.
"""

from __future__ import annotations

from ..errors import InvalidInput

# FLOW carries a uint32; a client asking for more than this in total is broken or hostile.
MAX_PERMITS = 2**31 - 1


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
    """Pause reading a transport while too many published bytes wait for storage."""

    __slots__ = ("_transport", "high_water", "low_water", "pending", "paused")

    def __init__(self, transport, high_water: int) -> None:
        self._transport = transport
        self.high_water = max(1, high_water)
        # Resume at half: avoids flapping pause/resume on every single append.
        self.low_water = self.high_water // 2
        self.pending = 0
        self.paused = False

    def add(self, nbytes: int) -> None:
        self.pending += nbytes
        if not self.paused and self.pending > self.high_water:
            self.paused = True
            self._transport.pause_reading()

    def release(self, nbytes: int) -> None:
        self.pending -= nbytes
        if self.paused and self.pending <= self.low_water:
            self.paused = False
            if not self._transport.is_closing():
                self._transport.resume_reading()
