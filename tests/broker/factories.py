"""Run a module's compaction tests against each compaction service factory (PIP-278).

``from .factories import compaction_factory, compactor`` in a test module overrides the
conftest's ``compaction_factory`` with one parametrized over two factories: the default Spark one
(those tests are marked ``spark``) and ``arrow_compaction.ArrowCompactionServiceFactory``, which
keeps its views in Parquet files of its own and computes them without Spark. The module's broker
runs with the factory named (``compactionServiceFactoryClassName``), and ``compact()`` in the
tests builds its service from the same name, so the tests themselves do not change.

``compactor`` is what compaction in the test process needs: the session's SparkSession for the
Spark factory, nothing for the other one (so ``-m "not spark"`` starts no JVM).
"""

from __future__ import annotations

import pytest

from compactmq.compaction import DEFAULT_FACTORY

ARROW_FACTORY = "tests.broker.arrow_compaction.ArrowCompactionServiceFactory"


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(DEFAULT_FACTORY, id="spark", marks=pytest.mark.spark),
        pytest.param(ARROW_FACTORY, id="arrow"),
    ],
)
def compaction_factory(request):
    return request.param


@pytest.fixture
def compactor(request, compaction_factory):
    if compaction_factory == DEFAULT_FACTORY:
        return request.getfixturevalue("spark")
    return None
