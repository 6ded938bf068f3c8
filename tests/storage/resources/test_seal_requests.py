"""Seal requests over every store (the real ZooKeeper included): ephemeral sequential keys that
die with the job's session, answers written with compare-and-set."""

from __future__ import annotations

import threading
import uuid

import pytest

from compactmq.errors import MetadataError
from compactmq.storage.metadata_store import create_metadata_store
from compactmq.storage.resources import SealRequestResources


def test_file_answer_withdraw(resources, store):
    requests = resources.seal_requests
    first = requests.file("persistent://t/n/a", 1)
    second = requests.file("persistent://t/n/b", 2)
    assert first < second  # the counter orders them
    pending = requests.pending()
    assert [(r.request_id, r.topic) for r in pending] == [
        (first, "persistent://t/n/a"),
        (second, "persistent://t/n/b"),
    ]
    seen = threading.Event()
    watch = requests.watch(first, lambda _: seen.set())
    assert requests.answer(pending[0], 10)
    assert seen.wait(10)
    watch.cancel()
    state = requests.get(first)
    assert state.answered and state.error is None
    assert not requests.answer(pending[0], 11)  # already answered: its version moved on
    assert [r.request_id for r in requests.pending()] == [second]
    requests.withdraw(second)
    assert not requests.answer(pending[1], 12)  # withdrawn: never brought back
    assert requests.get(second) is None
    requests.withdraw(second)  # twice is fine
    with pytest.raises(MetadataError):
        requests.get("../x")


@pytest.mark.parametrize("kind", ["memory", "sqlite", "zk"])
def test_a_request_dies_with_its_jobs_session(kind, tmp_path, request):
    """The job's store closes (its session ends): its request goes, answered or not."""
    tag = uuid.uuid4().hex[:12]
    url = {"memory": f"memory:seal{tag}", "sqlite": "sqlite:meta.db"}.get(kind)
    if url is None:
        url = f"zk:{request.getfixturevalue('zookeeper').hosts}/seal{tag}"
    writer_store = create_metadata_store(url, data_dir=tmp_path, operation_timeout_s=10)
    job_store = create_metadata_store(url, data_dir=tmp_path, operation_timeout_s=10)
    try:
        writer, job = SealRequestResources(writer_store), SealRequestResources(job_store)
        rid = job.file("persistent://t/n/a", 1)
        assert [r.request_id for r in writer.pending()] == [rid]
        job_store.close()
        assert writer.pending() == [] and writer.get(rid) is None
    finally:
        job_store.close()
        writer_store.close()
