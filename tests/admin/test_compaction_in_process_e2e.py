"""Small topics compacted in the broker's process (``compactionInProcessMaxBytes``) through the
official client and REST: a manual ``PUT .../compaction`` and the topics a namespace threshold
makes due together end SUCCESS with no Spark job (``lastCompactionJob`` null, no Spark job in
``lastCompactionRun``), read-compacted readers get each key's latest value, and the broker never
starts a JVM (the default factory plans with a local master's cores, ``local_parallelism``)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("pulsar")

from .harness import Http, publish, read_compacted, start_broker, topic_path, wait_status, web_url  # noqa: E402

pytestmark = pytest.mark.integration

MANUAL = "persistent://public/default/in-process-manual"
DUE = [f"persistent://public/default/in-process-due-{i}" for i in range(2)]
KEYS = 5


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("in-process") / "data", compactionInProcessMaxBytes="8388608")
    yield b
    b.stop()


def _java_children(pid: int) -> list[str]:
    """Command lines of java processes below ``pid`` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and "java" in cmd:
            found.append(cmd)
    return found


def test_small_topics_compact_without_a_spark_job(broker):
    http = Http(web_url(broker))
    publish(broker, MANUAL, 4 * KEYS, KEYS, prefix="m")
    http.ok("PUT", topic_path(MANUAL) + "/compaction")
    wait_status(http, MANUAL, "SUCCESS", timeout=60)
    stats = http.ok("GET", topic_path(MANUAL) + "/stats")["compaction"]
    assert stats["lastCompactionJob"] is None
    assert stats["lastCompactionRun"]["sparkMs"]["count"] == 0
    assert read_compacted(broker, MANUAL) == {f"k{k}": [f"m{3 * KEYS + k}".encode()] for k in range(KEYS)}

    for i, topic in enumerate(DUE):
        publish(broker, topic, 3 * KEYS, KEYS, prefix=f"t{i}-")
    http.ok("POST", "/admin/v2/namespaces/public/default/compactionThreshold", 1)
    try:
        for topic in DUE:
            wait_status(http, topic, "SUCCESS", timeout=60)
        for i, topic in enumerate(DUE):
            last = http.ok("GET", topic_path(topic) + "/stats")["compaction"]["lastCompactionRun"]
            assert last["status"] == "SUCCESS" and last["jobGroup"] is None
            assert read_compacted(broker, topic) == {
                f"k{k}": [f"t{i}-{2 * KEYS + k}".encode()] for k in range(KEYS)
            }
    finally:
        http.ok("DELETE", "/admin/v2/namespaces/public/default/compactionThreshold")
    assert _java_children(broker.proc.pid) == []
