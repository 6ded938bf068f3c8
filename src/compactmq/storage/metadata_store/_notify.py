"""Delivery of watch notifications and session events, shared by every implementation.

An implementation learns of a change on whatever thread it learns it (the committing thread, a
polling thread, kazoo's event thread) and hands it to ``Notifier.publish``. The notifier keeps the
registered watches and calls their callbacks on ONE thread of its own, in the order changes were
published, so that a callback may call the store (a kazoo event thread or a thread holding the
store's lock could not) and a slow callback delays only other callbacks. The thread starts with the
first watch or listener and stops on ``close``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from . import Notification, SessionEvent, SessionListener, Watch, WatchCallback

log = logging.getLogger(__name__)

_STOP = object()


class _Registered(Watch):
    def __init__(self, notifier: Notifier, path: str, callback: WatchCallback):
        self.notifier = notifier
        self.path = path
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self.notifier._remove(self)


class Notifier:
    """Watches by path and session listeners, called on one dispatch thread."""

    def __init__(self, name: str):
        self._name = name
        self._lock = threading.Lock()
        self._watches: dict[str, list[_Registered]] = {}
        self._session_listeners: list[SessionListener] = []
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    # --- registration --------------------------------------------------------------------------

    def add_watch(self, path: str, callback: WatchCallback) -> _Registered:
        watch = _Registered(self, path, callback)
        with self._lock:
            self._watches.setdefault(path, []).append(watch)
            self._start()
        return watch

    def _remove(self, watch: _Registered) -> None:
        with self._lock:
            same = self._watches.get(watch.path, [])
            if watch in same:
                same.remove(watch)
            if not same:
                self._watches.pop(watch.path, None)

    def add_session_listener(self, listener: SessionListener) -> None:
        with self._lock:
            self._session_listeners.append(listener)
            self._start()

    def watched_paths(self) -> list[str]:
        with self._lock:
            return list(self._watches)

    def has_watches(self) -> bool:
        return bool(self._watches)

    # --- publishing ----------------------------------------------------------------------------

    def publish(self, notifications: list[Notification]) -> None:
        """Queue callbacks for the watches of each notification's path (cheap when none match)."""
        if not self._watches:
            return
        with self._lock:
            calls = [(w, n) for n in notifications for w in self._watches.get(n.path, ())]
        for call in calls:
            self._queue.put(call)

    def deliver(self, watch: _Registered, notification: Notification) -> None:
        """Queue one callback of one watch (ZooKeeper: each watch has its own server-side watches)."""
        self._queue.put((watch, notification))

    def publish_session(self, event: SessionEvent) -> None:
        with self._lock:
            listeners = list(self._session_listeners)
        for listener in listeners:
            self._queue.put((listener, event))

    def run_later(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the dispatch thread (work that must not run on a client's event thread)."""
        with self._lock:
            self._start()
        self._queue.put((task, None))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(_STOP)
            if thread is not threading.current_thread():
                thread.join(timeout=5)

    # --- the dispatch thread -------------------------------------------------------------------

    def _start(self) -> None:  # with self._lock held
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(
                target=self._run, name=f"metadata-notify-{self._name}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            target, arg = item
            try:
                if isinstance(target, _Registered):
                    if not target.cancelled:
                        target.callback(arg)
                elif arg is None:
                    target()
                else:
                    target(arg)
            except Exception:  # one bad callback must not stop the others
                log.exception("metadata store callback failed")
