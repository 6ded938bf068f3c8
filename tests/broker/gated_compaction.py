"""The default (Spark) compaction service with a gate: a test holds a run at a named point.

``GatedSparkCompactionServiceFactory`` (named in ``compactionServiceFactoryClassName`` as
``tests.broker.gated_compaction.GatedSparkCompactionServiceFactory``) builds the very services the
default factory builds -- the same runner, view store, fence and commit -- and gives each one an
abort hook (``runner.ABORT_POINTS``) that looks in the directory named by ``GATE_DIR_ENV`` in the
broker's environment:

* while a file ``closed`` there holds a point name (``parts-written``, ``planned``...), a run that
  reaches that point writes ``reached-<pid>`` (so a test knows, without timing, that a run of this
  broker process is certainly at that point) and waits until ``closed`` is gone (at most 120 s);
* otherwise the hook does nothing.

Used by the cluster regression tests, where a run must straddle an ownership move: the Arrow test
factory keeps its views on one broker's disk and cannot move with a bundle.
"""

from __future__ import annotations

import os
import time

from compactmq.compaction.spark import SparkCompactionService, SparkCompactionServiceFactory

#: the directory of the gate's files, in the broker subprocess's environment
GATE_DIR_ENV = "COMPACTMQ_TEST_COMPACTION_GATE_DIR"


def gate(point: str) -> None:
    directory = os.environ.get(GATE_DIR_ENV)
    if not directory:
        return
    closed = os.path.join(directory, "closed")
    try:
        with open(closed) as f:
            held_at = f.read().strip()
    except FileNotFoundError:
        return
    if held_at != point:
        return
    with open(os.path.join(directory, f"reached-{os.getpid()}"), "w") as f:
        f.write(point)
    deadline = time.monotonic() + 120
    while os.path.exists(closed) and time.monotonic() < deadline:
        time.sleep(0.05)  # a stand-in for a long run, not test synchronisation


class GatedSparkCompactionServiceFactory(SparkCompactionServiceFactory):
    def new_service(self, topic: str) -> SparkCompactionService:
        return SparkCompactionService(
            self.storage, topic, self.config, spark_conf=self.spark_conf, abort_hook=gate
        )
