"""The compaction monitor of a real broker (Spark in its process) compacting the topics that
fall due at one check in ONE joint Spark job, over the official client and REST: each topic's
stats name the same job and list the topics that shared it, a topic whose run fails (a policy
the API would refuse, poked into the store) does not stop the others committing, and each
committed view holds exactly its topic's latest values.

One broker (one JVM) for the module."""

from __future__ import annotations


import pytest

pytest.importorskip("pulsar")

from .harness import (
    Http,
    poke_policy,
    publish,
    read_compacted,
    start_broker,
    topic_path,
    wait_status,
    web_url,
)  # noqa: E402

pytestmark = pytest.mark.integration

TOPICS = [f"persistent://public/default/joint-e2e-{i}" for i in range(4)]
KEYS = 10


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("joint") / "data", in_process=True)
    yield b
    b.stop()


def test_topics_due_at_one_check_share_one_job_and_fail_apart(spark_in_broker, broker):
    http = Http(web_url(broker))
    for i, topic in enumerate(TOPICS):
        publish(broker, topic, 3 * KEYS, KEYS, prefix=f"t{i}-")
    bad = TOPICS[3]
    poke_policy(broker.data_dir, "topic", bad, "compactionRetentionMode", "bogus")
    # one namespace policy makes every topic due at the same check
    http.ok("POST", "/admin/v2/namespaces/public/default/compactionThreshold", 1)
    for topic in TOPICS[:3]:
        wait_status(http, topic, "SUCCESS", timeout=180)
    wait_status(http, bad, "ERROR", timeout=60)

    runs = {t: http.ok("GET", topic_path(t) + "/stats")["compaction"] for t in TOPICS}
    jobs = {runs[t]["lastCompactionJob"] for t in TOPICS[:3]}
    assert len(jobs) == 1 and next(iter(jobs)).startswith("compactmq-joint-"), jobs
    for topic in TOPICS:
        last = runs[topic]["lastCompactionRun"]
        assert sorted(last["jobTopics"]) == sorted(TOPICS), last
        assert last["reason"].startswith("backlog")
        assert last["status"] == ("ERROR" if topic == bad else "SUCCESS")
    assert "bogus" in http.ok("GET", topic_path(bad) + "/compaction")["lastError"]
    _, text = http.call("GET", "/metrics")
    shared = [line for line in text.splitlines() if line.startswith("pulsar_compaction_last_job_topics{")]
    assert sum(1 for line in shared if line.endswith(f" {len(TOPICS)}")) == len(TOPICS), shared
    for i, topic in enumerate(TOPICS[:3]):
        want = {f"k{k}": [f"t{i}-{2 * KEYS + k}".encode()] for k in range(KEYS)}
        assert read_compacted(broker, topic) == want, topic
    http.ok("DELETE", "/admin/v2/namespaces/public/default/compactionThreshold")
