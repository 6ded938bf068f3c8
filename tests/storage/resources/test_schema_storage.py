"""Schema versions over every store (the real ZooKeeper included): deletion markers, the
compare-and-set that makes a broker re-check compatibility after another added a version."""

from __future__ import annotations

import pytest

from compactmq.storage.metadata_store import BadVersion
from compactmq.storage.schemas import SchemaStorage, active


@pytest.fixture
def schemas(resources):
    return SchemaStorage(resources.schemas, clock=lambda: 1234)


def test_versions_markers_and_force_delete(schemas, store):
    assert schemas.add("t/n/x", 4, b'{"type":"string"}', "s", {"k": "v"}) == 0
    assert schemas.add("t/n/x", 4, b"\x00\xffbytes") == 1
    [v0, v1] = schemas.versions("t/n/x")
    assert (v0.type, v0.data, v0.name, v0.properties, v0.timestamp_ms) == (
        4,
        b'{"type":"string"}',
        "s",
        {"k": "v"},
        1234,
    )
    assert v1.data == b"\x00\xffbytes"
    assert store.exists("/schemas/t/n/x/0000000001")
    assert schemas.delete("t/n/x") == 2 and active(schemas.versions("t/n/x")) == []
    assert schemas.delete("t/n/x") is None
    assert schemas.add("t/n/x", 1, b"") == 3
    assert schemas.delete("t/n/x", force=True) == 3
    assert schemas.versions("t/n/x") == [] and not store.exists("/schemas/t/n/x")
    assert schemas.delete("t/n/x", force=True) is None


def test_a_version_added_meanwhile_fails_the_expectation(schemas):
    """What two brokers registering at once see: the loser's compatibility check was made
    against an older history, so its write fails and it must check again."""
    assert schemas.add("t/n/y", 1, b"a", expected_latest=None) == 0
    with pytest.raises(BadVersion):
        schemas.add("t/n/y", 1, b"b", expected_latest=None)
    assert schemas.add("t/n/y", 1, b"b", expected_latest=0) == 1
    with pytest.raises(BadVersion):
        schemas.add("t/n/y", 1, b"c", expected_latest=0)
    assert [r.data for r in schemas.versions("t/n/y")] == [b"a", b"b"]
