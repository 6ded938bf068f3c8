"""``compactionSparkWarmup``: a standalone broker warms its compaction engine in the background.

Observed from outside, as an operator would: ``/metrics`` (``compactmq_compaction_engine_warm``
and its ``state`` label), the broker's log, its child processes. Whether the first run is faster
is measured by ``bench/first_trigger_bench.py``, not asserted here; what is asserted is that the
run after the warm-up uses the session the warm-up started (the broker has one JVM, not two).
"""

from __future__ import annotations

import os
import re
import urllib.request

import pytest

from .conftest import BrokerProcess, make_client
from .rest import ok, rest, wait_until

pytestmark = pytest.mark.integration

WARM_RE = re.compile(r'^compactmq_compaction_engine_warm\{cluster="[^"]*",state="(\w+)"\} (\d+)$', re.M)


def warm_metric(broker) -> tuple[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.web_port}/metrics", timeout=30) as r:
        m = WARM_RE.search(r.read().decode())
    assert m, "compactmq_compaction_engine_warm missing from /metrics"
    return m.group(1), int(m.group(2))


def java_descendants(pid: int) -> list[int]:
    """Processes under ``pid`` whose command is java (the Spark JVMs a broker started)."""
    children: dict[int, list[int]] = {}
    comm: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:
            continue
        p = int(entry)
        comm[p] = head.split("(", 1)[1]
        children.setdefault(int(tail.split()[1]), []).append(p)
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        if comm.get(p) == "java":
            out.append(p)
        todo.extend(children.get(p, []))
    return out


def test_warmup_is_off_in_test_brokers_and_reported_so(tmp_path):
    b = BrokerProcess(tmp_path / "data")  # the helper's default: compactionSparkWarmup=false
    b.start()
    try:
        assert warm_metric(b) == ("off", 0)
        assert java_descendants(b.proc.pid) == []
    finally:
        b.stop()


def test_warmup_failure_leaves_the_broker_serving(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))  # Spark cannot start: no JVM at all
    b = BrokerProcess(tmp_path / "data", {"compactionSparkWarmup": "true"})
    b.start()
    try:
        wait_until(lambda: warm_metric(b)[0] == "failed", timeout=120, what="the warm-up to fail")
        assert warm_metric(b) == ("failed", 0)
        assert ok(rest(b, "GET", "/admin/v2/clusters")) == ["standalone"]
        assert b.alive()
    finally:
        b.stop()
    assert "compaction warm-up failed" in b.log_path.read_text()


def test_warmup_starts_the_session_the_first_run_uses(tmp_path, spark_in_broker):
    b = BrokerProcess(tmp_path / "data", {"compactionSparkWarmup": "true", "spark.master": "local[2]"})
    b.start()  # ready before the warm-up ends: readiness never waits for Spark
    try:
        topic = "persistent://public/default/warmed"
        client = make_client(b.url)
        try:
            producer = client.create_producer(topic, batching_enabled=False)
            for i in range(200):
                producer.send(b"v%d" % i, partition_key=f"k{i % 20}")
        finally:
            client.close()
        wait_until(lambda: warm_metric(b)[0] != "warming", timeout=600, what="the warm-up to end")
        assert warm_metric(b) == ("warm", 1)
        jvms = java_descendants(b.proc.pid)
        assert len(jvms) == 1, jvms
        # the first real run: it succeeds on the warmed session, and starts no other JVM
        ok(rest(b, "PUT", f"/admin/v2/persistent/{topic.split('://')[1]}/compaction"))
        status = wait_until(
            lambda: (
                (s := ok(rest(b, "GET", f"/admin/v2/persistent/{topic.split('://')[1]}/compaction")))[
                    "status"
                ]
                in ("SUCCESS", "ERROR")
                and s
            ),
            timeout=300,
            what="the compaction to end",
        )
        assert status["status"] == "SUCCESS", status
        assert java_descendants(b.proc.pid) == jvms
        assert warm_metric(b) == ("warm", 1)
    finally:
        b.stop()
    # the broker ran at WARNING (the helper's --log-level), so only the metric tells "warm";
    # the scratch topic of the warm-up never shows in the broker's own metadata
    assert "__compactmq_warmup" not in b.log_path.read_text()
