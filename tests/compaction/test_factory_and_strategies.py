"""Factory loading by class name (PIP-278) and the strategies' fold (PIP-215)."""

from __future__ import annotations

import pytest

from compactmq.compaction import (
    CompactionServiceFactory,
    TopicCompactionService,
    load_factory,
)
from compactmq.compaction.strategies import (
    EventTimeStrategy,
    KeepFirstStrategy,
    KeepLatestStrategy,
    Message,
    fold,
    resolve_strategy,
)
from compactmq.config import load_config
from compactmq.errors import InvalidConfiguration


class NullService(TopicCompactionService):
    def __init__(self, topic):
        self.topic = topic

    def compact(self, progress=None):
        return None

    def read_compacted_entries(self, start_position, n):
        return []

    def read_last_compacted_entry(self):
        return None

    def get_last_compacted_position(self):
        return None


class UserFactory(CompactionServiceFactory):
    def new_service(self, topic):
        return NullService(topic)


class LongestPayloadWins:
    """A user strategy: keep the longer payload."""

    def should_keep_left(self, prev, cur):
        return len(prev.payload) > len(cur.payload)


def test_default_factory_is_spark_and_starts_nothing():
    from compactmq.compaction.jobs import SparkCompactionServiceFactory

    import subprocess
    import sys

    f = load_factory(load_config())
    assert type(f) is SparkCompactionServiceFactory
    # loading (and importing the package) starts no JVM: checked in a fresh interpreter
    code = (
        "import pyspark; from compactmq.compaction import load_factory; from compactmq.config import load_config; "
        "load_factory(load_config()); assert pyspark.SparkContext._active_spark_context is None"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_factory_name_of_older_configs_still_loads_the_default():
    from compactmq.compaction.jobs import SparkCompactionServiceFactory

    old = {"compactionServiceFactoryClassName": "compactmq.compaction.jobs.SparkCompactionServiceFactory"}
    assert type(load_factory(old)) is SparkCompactionServiceFactory


def test_user_factory_by_class_name():
    f = load_factory({"compactionServiceFactoryClassName": f"{__name__}.UserFactory"}, storage="S")
    assert isinstance(f, UserFactory) and f.storage == "S"
    assert f.new_service("t").topic == "t"


@pytest.mark.parametrize(
    "name, words",
    [
        ("nodots", "dotted name"),
        ("compactmq.no_such_module.Factory", "cannot import module"),
        ("compactmq.compaction.NoSuchFactory", "has no 'NoSuchFactory'"),
        ("compactmq.compaction.TopicCompactionService", "not a CompactionServiceFactory"),
    ],
)
def test_bad_factory_name_is_one_clear_error(name, words):
    with pytest.raises(InvalidConfiguration) as e:
        load_factory({"compactionServiceFactoryClassName": name})
    assert words in str(e.value) and name in str(e.value)


def _m(key, payload, i, et=0):
    return Message(key, payload, (1, i, 0), 0, et)


HISTORY = [_m("k", b"a", 0, 5), _m("k", b"b", 1, 9), _m("k", b"c", 2, 9), _m("k", b"d", 3, 1)]


def test_builtin_strategies_fold():
    assert fold(HISTORY, KeepLatestStrategy()).payload == b"d"
    assert fold(HISTORY, KeepFirstStrategy()).payload == b"a"
    assert fold(HISTORY, EventTimeStrategy()).payload == b"c"  # newest event time, later on ties
    tomb = [*HISTORY, _m("k", b"", 4)]
    for s in (KeepLatestStrategy(), KeepFirstStrategy(), EventTimeStrategy()):
        assert fold(tomb, s) is None
    assert fold([*tomb, _m("k", b"e", 5, 0), _m("k", b"f", 6, 0)], KeepFirstStrategy()).payload == b"e"


def test_resolve_strategy_names_and_user_class():
    assert isinstance(resolve_strategy(None), KeepLatestStrategy)
    assert isinstance(resolve_strategy("keep-first"), KeepFirstStrategy)
    assert isinstance(resolve_strategy("event-time"), EventTimeStrategy)
    user = resolve_strategy(f"{__name__}.LongestPayloadWins", {f"{__name__}.LongestPayloadWins"})
    assert fold([_m("k", b"xxx", 0), _m("k", b"y", 1)], user).payload == b"xxx"
    with pytest.raises(InvalidConfiguration):
        resolve_strategy("newest")
    with pytest.raises(InvalidConfiguration):
        resolve_strategy(f"{__name__}.HISTORY", {f"{__name__}.HISTORY"})


def test_resolve_strategy_imports_only_allowed_classes():
    import sys

    name = "tests_never_imported_canary.Strategy"
    with pytest.raises(InvalidConfiguration, match="not allowed on this broker"):
        resolve_strategy(f"{__name__}.LongestPayloadWins")  # a class, but not on the list
    with pytest.raises(InvalidConfiguration, match="topicCompactionStrategyAllowedClasses"):
        resolve_strategy("multiprocessing.pool.Pool", {name})
    with pytest.raises(InvalidConfiguration):
        resolve_strategy(name + "X", {name})
    assert "tests_never_imported_canary" not in sys.modules
