"""The per-topic compaction lock: an exclusive ``flock`` on ``<compacted dir>/.lock``.

One compaction run per topic at a time, across processes (the broker's own runs and
``compact-topic`` jobs); the kernel releases it when the process dies. The offloader takes it
too (through ``tiered.attach``), without waiting, before it deletes a topic's dead view objects
from the object store, so that it never deletes the parts of a run still uploading them.
"""

from __future__ import annotations

import fcntl
import os
from typing import Optional

from ..errors import Conflict
from ..storage.modes import FILE_MODE


class TopicLock:
    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise Conflict("a compaction of this topic is already running") from None

    @classmethod
    def try_acquire(cls, directory: str) -> Optional["TopicLock"]:
        try:
            return cls(directory)
        except (Conflict, OSError):
            return None

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
