"""Which topics the compaction monitor's periodic check looks at: those that changed.

The check (``compaction_due.DueCheck``) reads a topic's policies, its managed ledger's sizes and
its compaction state to tell whether it is due. Doing that for every topic of the broker at
every interval costs a broker with thousands of mostly idle topics thousands of metadata reads
a minute for nothing. A topic's answer can only change when

* it was **appended to** (its backlog grew): the broker's topics tell this module after each
  append (``TopicManager.appended_listeners``) -- unless only time can make it due (a maximum
  lag, no threshold, no minimum lag: an append does not change its oldest uncompacted message,
  its timer says when to look; with many such topics published to all the time, a check would
  otherwise read every one of them);
* one of its **policies changed** (``compactionThreshold``, ``compactionMaxLagSeconds``,
  ``compactionMinLagSeconds`` on the topic, its partitioned topic or its namespace): the admin
  API tells the broker's topics, which tell this module (``TopicManager.policy_listeners``);
* **time passed** for a topic with a maximum or minimum lag: the check says when the topic's
  oldest uncompacted message will be older than its maximum lag (less the time a run takes to
  commit: ``compaction_due.lag_lead_ms``), or when held-back messages age past the minimum lag,
  and this module wakes it then (a heap of timers). An append to a topic with a maximum lag and
  no timer starts one that fires at once: the check it wakes reads the publish time of the
  topic's oldest uncompacted message -- which may be well before the append (a producer's
  batching or clock, a backfill), so a timer counted from the append could fire after the
  topic fell due -- and sets the exact timer. So the first message after a run is not left
  waiting for the next interval's check, and later appends find the timer set; the monitor's
  check loop sleeps only until the earliest timer (``next_timer``, ``on_timer``). A check that
  reads a topic drops its timer first and sets the one the ledger calls for (``reading``), as a
  full check does for every topic: a timer guessed earlier -- at a run's end, counted from the
  end -- would otherwise outlive a read that found nothing uncompacted, and the first append
  after it, of a message published before the end, would find it set and wait for it, past the
  time the message makes the topic due;
* a **run of it ended** (a failed run is retried at the next check while still due; a run may
  leave a backlog that arrived while it ran), or a compact-topic job of another process held it.
  While a run of a topic is queued or running (``busy``) an append starts no lag timer for it:
  the check skips a busy topic, and the end of its run is looked at anyway (a timer per append
  would wake the check loop for nothing, once a lag topic's lead is as long as its lag).

``take(now)`` hands the check those topics, each once; everything else is skipped at no cost.
Two safety nets: the first check after start looks at every topic (nothing is known yet), and
so does one check every ``compactionMonitorFullScanIntervalInSeconds``: a change this broker
did not make (a namespace policy set through another broker of a cluster, a topic appended by
another process) is seen then.

Thread-safety: appends and policy changes are noted on the event loop, the check runs in a
worker thread; one lock guards the sets.
"""

from __future__ import annotations

import heapq
import threading
import time
from typing import Callable, Optional

from ..naming import TopicName


class DueWatch:
    """The topics the next check must look at (module notes)."""

    def __init__(self, full_scan_seconds: float, clock: Callable[[], float] = time.time) -> None:
        """``full_scan_seconds``: a check looks at every topic at least this often (0: every
        check does, as if nothing told this module of changes). ``clock``: the monitor's."""
        self.full_scan_seconds = float(full_scan_seconds)
        self.clock = clock
        #: called with the time of a timer an append started (the monitor's check loop may
        #: have to wake earlier than it planned)
        self.on_timer: Optional[Callable[[float], None]] = None
        self._lag_delay: dict[str, float] = {}  # topics with a max lag: seconds from an append to due
        self._time_only: set[str] = set()  # ... of which only time makes due: appends need no look
        self._busy: set[str] = set()  # a run of it is queued or running: appends start no timer
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        self._timers: list[tuple[float, str]] = []  # (when, topic), a heap; stale ones skipped
        self._timer_at: dict[str, float] = {}  # the live timer of each topic
        self._next_full: Optional[float] = None  # None: the next take is a full check
        self._by_namespace: dict[str, set[str]] = {}  # topics seen, per namespace
        self.full_checks = 0  # checks that looked at every topic (tests and metrics)
        self.topics_checked = 0  # topics handed to checks, in all (tests and metrics)

    # --- sources of change --------------------------------------------------------------------

    def touch(self, topic: str) -> None:
        """``topic`` was appended to: the next check looks at it; a topic with a maximum lag and
        no timer gets one that fires at once (the check sets the exact one: module notes). A
        topic only time can make due (a maximum lag, no threshold, no minimum lag) is not looked
        at for an append otherwise: its timer says when."""
        self._touched(topic, append=True)

    def busy(self, topic: str) -> None:
        """A run of ``topic`` was queued: until it ends, appends start no lag timer for it."""
        with self._lock:
            self._busy.add(topic)

    def run_ended(self, topic: str) -> None:
        """A run of ``topic`` ended: the next check looks at it (a failed run is retried, a
        backlog that grew meanwhile seen)."""
        with self._lock:
            self._busy.discard(topic)
        self._touched(topic, append=False)

    def _touched(self, topic: str, append: bool) -> None:
        started = None
        with self._lock:
            if not (append and topic in self._time_only):
                self._dirty.add(topic)
            delay = self._lag_delay.get(topic)
            if delay is not None and topic not in self._timer_at and topic not in self._busy:
                # an append: look now (its message may be older than the append); a run's end:
                # the topic is looked at anyway, the timer is for a check that cannot take it
                started = self.clock() if append else self.clock() + delay
                self._timer_at[topic] = started
                heapq.heappush(self._timers, (started, topic))
        if started is not None and self.on_timer is not None:
            self.on_timer(started)

    def lag_policy(self, topic: str, delay: Optional[float], time_only: bool = False) -> None:
        """(the check) ``topic`` falls due ``delay`` seconds after its oldest uncompacted message
        was published (its maximum lag less a run's lead), None: it has no maximum lag.
        ``time_only``: nothing but time can make it due (no threshold, no minimum lag)."""
        with self._lock:
            if delay is None:
                self._lag_delay.pop(topic, None)
            else:
                self._lag_delay[topic] = max(0.0, delay)
            if time_only and delay is not None:
                self._time_only.add(topic)
            else:
                self._time_only.discard(topic)

    def has_lag(self, topic: str) -> bool:
        """Whether the last check of ``topic`` found a maximum lag."""
        return topic in self._lag_delay

    def next_timer(self) -> Optional[float]:
        """When the earliest live timer falls due (None: no timer)."""
        with self._lock:
            while self._timers and self._timer_at.get(self._timers[0][1]) != self._timers[0][0]:
                heapq.heappop(self._timers)  # a stale one: its topic's timer moved or fired
            return self._timers[0][0] if self._timers else None

    def wake_at(self, topic: str, when: float) -> None:
        """Look at ``topic`` again at ``when`` (seconds of the clock), whatever happens first."""
        with self._lock:
            current = self._timer_at.get(topic)
            if current is not None and current <= when:
                return
            self._timer_at[topic] = when
            heapq.heappush(self._timers, (when, topic))

    def full_scan_soon(self) -> None:
        """The next check looks at every topic."""
        with self._lock:
            self._next_full = None

    def forget(self, topic: str) -> None:
        """A deleted topic: nothing of it is kept."""
        with self._lock:
            self._dirty.discard(topic)
            self._timer_at.pop(topic, None)
            self._lag_delay.pop(topic, None)
            self._time_only.discard(topic)
            self._busy.discard(topic)
            try:
                ns = TopicName.parse(topic).namespace_name
            except Exception:  # noqa: BLE001 - not a topic name: nothing of it is kept
                return
            self._by_namespace.get(ns, set()).discard(topic)

    # --- the check ----------------------------------------------------------------------------

    def take(self, now: float, ahead: float = 0.0) -> Optional[list[str]]:
        """The topics the check at ``now`` looks at, or None when it must look at every topic;
        ``ahead``: also those whose timers fall due within this many seconds (they may join a
        job of the topics due now; the check sets their timers again when they do not)."""
        with self._lock:
            if self.full_scan_seconds <= 0 or self._next_full is None or now >= self._next_full:
                self._next_full = now + self.full_scan_seconds
                self._dirty.clear()
                self._timers.clear()
                self._timer_at.clear()
                self.full_checks += 1
                return None
            topics = self._dirty
            self._dirty = set()
            while self._timers and self._timers[0][0] <= now + ahead:
                when, topic = heapq.heappop(self._timers)
                if self._timer_at.get(topic) == when:
                    del self._timer_at[topic]
                    topics.add(topic)
            self.topics_checked += len(topics)
            return sorted(topics)

    def looked_at(self, topic: str) -> None:
        """The check read ``topic``: a change of its namespace's policies concerns it."""
        try:
            ns = TopicName.parse(topic).namespace_name
        except Exception:  # noqa: BLE001 - not a topic name
            return
        with self._lock:
            self._by_namespace.setdefault(ns, set()).add(topic)

    def reading(self, topic: str) -> None:
        """The check is about to read ``topic``'s ledger: ``looked_at``, and its timer goes --
        the check sets the one what it reads calls for (``wake_at``), as a full check does for
        every topic. A timer set before may be later than the topic's oldest uncompacted message
        makes it due (the guess at a run's end counts from the end, not from a message published
        earlier), and while it lives an append starts no timer of its own (module notes). An
        append after this call starts one that fires at once, so none is lost to the read."""
        self.looked_at(topic)
        with self._lock:
            self._timer_at.pop(topic, None)  # its heap entry is stale now: skipped

    def policies_changed(self, name: str) -> None:
        """The policies of ``name`` changed: a namespace (``tenant/ns``: every topic of it the
        checks have seen), or a topic (it and, for a partitioned topic, its partitions)."""
        if "://" not in name:
            with self._lock:
                self._dirty.update(self._by_namespace.get(name, ()))
            return
        try:
            ns = TopicName.parse(name).namespace_name
        except Exception:  # noqa: BLE001 - not a topic name
            return
        prefix = name + "-partition-"
        with self._lock:
            self._dirty.add(name)
            self._dirty.update(t for t in self._by_namespace.get(ns, ()) if t.startswith(prefix))

    @property
    def waiting(self) -> int:
        """Topics with a timer (tests and metrics)."""
        with self._lock:
            return len(self._timer_at)


__all__ = ["DueWatch"]
