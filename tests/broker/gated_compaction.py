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

A run that was held writes ``ended-<pid>`` (its outcome: ``ok`` or the error) once it returns or
raises, so a test can wait for a deposed broker's run to be over before it looks at the stores.

Used by the cluster regression tests, where a run must straddle an ownership move: the Arrow test
factory keeps its views on one broker's disk and cannot move with a bundle.
"""

from __future__ import annotations

import os
import time

from compactmq.compaction.jobs import SparkCompactionService, SparkCompactionServiceFactory

#: the directory of the gate's files, in the broker subprocess's environment
GATE_DIR_ENV = "COMPACTMQ_TEST_COMPACTION_GATE_DIR"


def _directory():
    return os.environ.get(GATE_DIR_ENV)


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


class GatedSparkCompactionService(SparkCompactionService):
    def compact(self, progress=None, *, engine=None):
        directory = _directory()
        reached = os.path.join(directory, f"reached-{os.getpid()}") if directory else None
        outcome = "ok"
        try:
            return super().compact(progress, engine=engine)
        except BaseException as e:
            outcome = f"{type(e).__name__}: {e}"
            raise
        finally:
            if reached is not None and os.path.exists(reached):  # this run was the held one
                with open(os.path.join(directory, f"ended-{os.getpid()}"), "w") as f:
                    f.write(outcome)


class GatedSparkCompactionServiceFactory(SparkCompactionServiceFactory):
    def new_service(self, topic: str) -> SparkCompactionService:
        return GatedSparkCompactionService(
            self.storage, topic, self.config, spark_conf=self.spark_conf, abort_hook=gate
        )
