"""The one place that configures a SparkSession for compaction. Nothing starts Spark at import.

``get_session(spark_conf)`` merges, lowest first: ``config.SPARK_DEFAULTS``, ``RUN_DEFAULTS``
(settings compaction relies on), then the caller's ``spark.*`` settings (``cfg.spark``, where the
operator's ``spark.master``, driver memory ... arrive). ``TEST_CONF`` is the profile the test suite
uses: ``local[2]``, UI off, few shuffle partitions, one session per test run. The session is
obtained with ``getOrCreate``, so a broker reuses the session its process already has.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Mapping, Optional

RUN_DEFAULTS: dict[str, str] = {
    # Python workers are reused between tasks: they keep imports (numpy, pyarrow) warm
    "spark.python.worker.reuse": "true",
    # phase one ships (key, position, flags) rows; larger Arrow batches cost less per row
    "spark.sql.execution.arrow.maxRecordsPerBatch": "1000000",
    # no partial aggregation before a shuffle: keep-latest rows reach the JVM already reduced to
    # one per key and parsing task (the Python combiner, tasks.group_rows), and the other
    # strategies aggregate after a window that has already partitioned by key, so Spark's partial
    # aggregate would build a hash map of every row for nothing (about 1 JVM CPU-second per
    # 10 M messages; bench/results/phase_one.json)
    "spark.sql.execution.bypassPartialAggregation": "true",
    # the keep-latest aggregate's shuffle starts with this many partitions, which adaptive query
    # execution then coalesces to what the rows need (two at 10 M messages over 1 M keys). With
    # only ``spark.sql.shuffle.partitions`` (4 to 8) a task of a 30 M-key topic held 7 M keys and
    # its hash map spilled: 42.6 s against 35.0 s with 200 or 64 (bench/results/compaction_30m.json)
    "spark.sql.adaptive.coalescePartitions.initialPartitionNum": "64",
    "spark.sql.session.timeZone": "UTC",
    # Python workers keep the memory they free for their next task instead of handing it back
    # to the kernel: glibc neither maps large blocks apart nor trims its heap, and Arrow
    # allocates through it too (its default pool returns memory within milliseconds). A task's
    # arrays are the same size run after run; on a virtual machine that gives idle guest memory
    # back to its host, memory touched afresh cost 2.3 CPU-s per GB against 0.04 kept (workers
    # idle for a minute exit, and their memory goes with them)
    "spark.executorEnv.MALLOC_MMAP_MAX_": "0",
    "spark.executorEnv.MALLOC_TRIM_THRESHOLD_": str(1 << 40),
    "spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL": "system",
}

TEST_CONF: dict[str, str] = {
    "spark.master": "local[2]",
    "spark.app.name": "compactmq-tests",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.coalescePartitions.initialPartitionNum": "4",  # tiny topics
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
}


def session_conf(spark_conf: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    from ...config import SPARK_DEFAULTS

    conf = dict(SPARK_DEFAULTS)
    conf.update(RUN_DEFAULTS)
    conf.update({k: str(v) for k, v in (spark_conf or {}).items()})
    return conf


#: the session ``get_session`` last returned and the settings it was asked with: every run asks
#: for the session, and going through the builder again costs some twenty round trips to the
#: JVM (a setting each, the log level) and a warning per run, for a session that already exists
_last: tuple = (None, None)
_last_lock = threading.Lock()


def get_session(spark_conf: Optional[Mapping[str, str]] = None):
    """The process's SparkSession, created with compaction's settings when there is none yet."""
    global _last
    conf = session_conf(spark_conf)
    with _last_lock:
        known, session = _last
        if known == conf and session is not None and session.sparkContext._jsc is not None:
            return session  # not stopped since: the same session the builder would return
    # Python workers must run the interpreter (and see the packages) of this process
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    with _last_lock:
        _last = (conf, session)
    return session


def testing_session():
    """The test profile's session (see ``TEST_CONF``)."""
    return get_session(TEST_CONF)
