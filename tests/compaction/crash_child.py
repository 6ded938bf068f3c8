"""A compaction run in its own process that dies at a chosen point (the crash test's child).

    python -m tests.compaction.crash_child DATA_DIR TOPIC MODE ARG

MODE ``point``: SIGKILL itself when the run reaches abort point ARG (driver side);
MODE ``task``: a Spark task of phase two kills its Python worker (ARG is ignored);
MODE ``timer``: SIGKILL itself ARG seconds after phase one starts (wherever the run is then).
"""

from __future__ import annotations

import os
import signal
import sys
import threading


class KillAt:
    """A ``RunPlan.task_probe`` that SIGKILLs the process of the task reaching ``point``.

    Defined in the script Python runs as ``__main__``, so Spark's cloudpickle ships it by value
    with the plan: the Python worker kills itself without importing the tests."""

    def __init__(self, point: str):
        self.point = point

    def __call__(self, point: str) -> None:
        if point == self.point:
            os.kill(os.getpid(), signal.SIGKILL)


def main(data_dir: str, topic: str, mode: str, arg: str) -> int:
    from compactmq.compaction.jobs import SparkCompactionService
    from compactmq.compaction.jobs.session import TEST_CONF, get_session
    from compactmq.config import load_config
    from compactmq.storage import Storage

    def die(*_):
        os.kill(os.getpid(), signal.SIGKILL)

    get_session(TEST_CONF)
    cfg = load_config()
    storage = Storage(data_dir, cfg, read_only=True)  # beside the test's read-write Storage
    hook = (lambda point: die() if point == arg else None) if mode == "point" else None
    probe = KillAt("phase-two-task") if mode == "task" else None
    service = SparkCompactionService(
        storage, topic, cfg, spark_conf=TEST_CONF, abort_hook=hook, task_probe=probe
    )
    started = threading.Event()

    def progress(p):
        if mode == "timer" and p.phase == "phase-one" and not started.is_set():
            started.set()
            threading.Timer(float(arg), die).start()

    service.compact(progress)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
