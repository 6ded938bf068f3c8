import pytest

from compactmq.errors import InvalidTopicName
from compactmq.naming import TopicName, canonical


@pytest.mark.parametrize(
    "given, expected",
    [
        ("t", "persistent://public/default/t"),
        ("my-tenant/my-ns/orders", "persistent://my-tenant/my-ns/orders"),
        ("persistent://a/b/c", "persistent://a/b/c"),
        ("non-persistent://a/b/c", "non-persistent://a/b/c"),
        ("persistent://a/b/c-partition-2", "persistent://a/b/c-partition-2"),
    ],
)
def test_names_expand_like_pulsar(given, expected):
    assert canonical(given) == expected


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "   ",
        "a/b",
        "a/b/c/d",
        "kafka://a/b/c",
        "persistent://a/b",
        "persistent://a b/ns/t",
        "persistent://a/b/",
        " t",
    ],
)
def test_invalid_names_are_clear_errors(bad):
    with pytest.raises(InvalidTopicName):
        TopicName.parse(bad)


def test_partitions_round_trip():
    base = TopicName.parse("persistent://p/ns/orders")
    part = base.partition(3)
    assert str(part) == "persistent://p/ns/orders-partition-3"
    assert part.partition_index == 3
    assert part.partitioned_base == base
    assert base.partition_index == -1
    assert base.namespace_name == "p/ns"
