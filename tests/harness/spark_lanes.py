"""Spark lanes: the modules that start a JVM in the test process run on few xdist workers.

Every xdist worker that runs a ``spark`` test starts a JVM of its own (the worker's one shared
SparkSession, ``conftest.spark``) and pays its start-up and warm-up: several seconds of CPU, and
a JIT that has to learn the same jobs again. With plain ``--dist loadfile`` the Spark modules are
spread over every worker (they are the longest ones, queued first), so a 4-worker run starts four
session JVMs on CI's two cores. Here the Spark modules are put into ``lanes`` (half the workers,
at least one; ``COMPACTMQ_SPARK_LANES`` overrides): a lane is ONE xdist work unit, a list of
whole modules that one worker runs one after the other on its one warm session, so only that many
workers ever start a session JVM. The other modules stay one work unit each, as ``loadfile``
makes them.

How the controller knows: xdist's controller does not collect tests, and which module needs Spark
is decided at collection (``conftest.pytest_collection_modifyitems``: a test that uses the
``spark`` fixture). So each worker writes the Spark modules it collected, in queue order, to a
file named in its ``workerinput`` (``SPARK_MODULES_KEY``); the controller reads one when it
splits the collection into work units, which xdist does only after every worker has finished
collecting. Node ids are not changed (unlike ``--dist loadgroup``), so reports and reruns name
tests as always.

Lanes are filled longest module first onto the lightest lane (``LONG_MODULES`` weights; any other
Spark module counts ``DEFAULT_WEIGHT``), and a lane is queued where its first module was, so the
long-first order of the queue still holds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from xdist.scheduler import LoadFileScheduling

#: the ``workerinput`` key naming the file a worker writes its Spark modules to
SPARK_MODULES_KEY = "compactmq_spark_modules_file"
#: the weight (seconds) of a Spark module not in ``LONG_MODULES``
DEFAULT_WEIGHT = 3


def assign_lanes(modules: Sequence[str], weights: Mapping[str, float], lanes: int) -> dict[str, str]:
    """Module -> lane name: each module, heaviest first, onto the lane with the least weight."""
    load = [0.0] * max(1, lanes)
    out: dict[str, str] = {}
    for module in sorted(modules, key=lambda m: -weights.get(m, DEFAULT_WEIGHT)):
        lane = min(range(len(load)), key=lambda i: load[i])
        load[lane] += weights.get(module, DEFAULT_WEIGHT)
        out[module] = f"spark-lane-{lane}"
    return out


def write_spark_modules(path: str, modules: Sequence[str]) -> None:
    """The worker's side: its Spark modules, one per line (written whole, then renamed)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write("".join(f"{m}\n" for m in modules))
    os.replace(tmp, path)


class SparkLaneScheduling(LoadFileScheduling):
    """``--dist loadfile`` with the Spark modules in lanes (see the module docstring)."""

    def __init__(self, config, log=None, *, modules_file: str, weights: Mapping[str, float]):
        super().__init__(config, log)
        self.modules_file = modules_file
        self.weights = weights
        self._lanes: dict[str, str] | None = None

    def lane_count(self) -> int:
        env = os.environ.get("COMPACTMQ_SPARK_LANES")
        return int(env) if env else max(1, len(self.nodes) // 2)

    def lanes(self) -> dict[str, str]:
        if self._lanes is None:
            try:
                with open(self.modules_file) as f:
                    modules = [line.strip() for line in f if line.strip()]
            except FileNotFoundError:  # no worker wrote one: plain loadfile
                modules = []
            self._lanes = assign_lanes(modules, self.weights, self.lane_count())
        return self._lanes

    def _split_scope(self, nodeid: str) -> str:
        module = super()._split_scope(nodeid)
        return self.lanes().get(module, module)
