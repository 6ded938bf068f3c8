"""The offload crash tests' probe: a process whose ``COMPACTMQ_OFFLOAD_FAULT`` names a step of
``storage.offload`` (``FAULT_POINTS``, ``DEAD_DELETE_FAULT``, ``compacted-after-data``) kills
itself with SIGKILL there, so the tests stop a real process at each step.

The offloader reports each step to ``LedgerOffloader.probe``; production sets none. A test child
script calls ``install()`` before it builds its ``Storage``; a broker runs as

    python -m tests.storage.offload_fault standalone ...   # ``compactmq.cli.main``, probed
"""

from __future__ import annotations

import os
import signal
import sys

FAULT_ENV = "COMPACTMQ_OFFLOAD_FAULT"


class KillAt:
    """A probe that SIGKILLs this process at step ``point`` (an object, not a function: as a
    class attribute a function would become a method)."""

    def __init__(self, point: str):
        self.point = point

    def __call__(self, point: str) -> None:
        if point == self.point:
            os.kill(os.getpid(), signal.SIGKILL)


def install() -> None:
    """Probe every offloader of this process at the step ``COMPACTMQ_OFFLOAD_FAULT`` names (none
    when unset)."""
    from compactmq.storage.offload import LedgerOffloader

    point = os.environ.get(FAULT_ENV, "")
    LedgerOffloader.probe = KillAt(point) if point else None


if __name__ == "__main__":
    install()
    from compactmq.cli.main import main

    sys.exit(main(sys.argv[1:]))
