"""``compactmq compact-topic`` on a partitioned topic: all partitions in one Spark job, one
progress line for the topic, each partition committed (beside a read-write Storage, which
answers the job's seal requests as a broker would).

The command runs in this process (``harness.cli``: ``main(argv)``, its streams captured) on the
test run's SparkSession; ``test_cli.py`` runs compact-topic as a process of its own."""

from __future__ import annotations

import json

import pytest

from compactmq.compaction.jobs import SparkCompactionService
from compactmq.config import load_config
from compactmq.storage import Storage

from harness.cli import run_cli

from . import entries as E

pytestmark = [pytest.mark.spark]

TOPIC = "persistent://public/default/cli-parted"


def test_compact_topic_on_a_partitioned_topic_is_one_job(spark, tmp_path):
    cfg = load_config(overrides={"managedLedgerSyncData": False})
    storage = Storage(str(tmp_path), cfg)
    try:
        storage.create_partitioned_topic(TOPIC, 2)
        names = [f"{TOPIC}-partition-{i}" for i in range(2)]
        for i, name in enumerate(names):  # the same keys in both partitions, values of their own
            ml = storage.open_managed_ledger(name)
            ml.append_many([E.single(f"k{j % 3}", b"p%dv%d" % (i, j)) for j in range(30)])
        out = run_cli(
            "--output",
            "json",
            "compact-topic",
            "--topic",
            TOPIC,
            "--data-dir",
            str(tmp_path),
            "--spark-master",
            "local[1]",  # ignored here: the command reuses the run's session, as a broker does
            "--config-override",
            "spark.ui.enabled=false",
        )
        assert out.returncode == 0, out.stderr[-2000:]
        body = json.loads(out.stdout)
        assert body["failedPartitions"] == 0 and sorted(body["partitions"]) == names
        assert body["messagesRead"] == 60 and body["messagesKept"] == 6
        # one progress line for the whole topic (stderr is not a tty: a few lines, all the topic's)
        progress = [line for line in out.stderr.splitlines() if line.startswith("compact-topic ")]
        assert progress and all(line.startswith(f"compact-topic {TOPIC}: ") for line in progress)
        assert any(f"{TOPIC}: done" in line for line in progress)
        jobs = set()
        for i, name in enumerate(names):
            service = SparkCompactionService(storage, name, cfg)
            got = [E.decode(b)[1][0][1:3] for _, b in service.read_compacted_entries((0, 0), 10)]
            assert got == [("k0", b"p%dv27" % i), ("k1", b"p%dv28" % i), ("k2", b"p%dv29" % i)]
            jobs.add(service.stats().last_run_job)
            service.close()
        assert len(jobs) == 1 and next(iter(jobs)).startswith("compactmq-joint-")
    finally:
        storage.close()
