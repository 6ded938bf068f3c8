"""The Spark lanes of the xdist run (``harness.spark_lanes``): which modules share a work unit."""

from __future__ import annotations

from harness.spark_lanes import SparkLaneScheduling, assign_lanes, write_spark_modules


def test_lanes_take_the_heaviest_module_first_onto_the_lightest_lane():
    weights = {"a.py": 90, "b.py": 80, "c.py": 30, "d.py": 20}
    lanes = assign_lanes(["d.py", "c.py", "b.py", "a.py", "e.py"], weights, 2)
    assert lanes == {
        "a.py": "spark-lane-0",
        "b.py": "spark-lane-1",
        "c.py": "spark-lane-1",  # 80 + 30 against 90
        "d.py": "spark-lane-0",  # 90 + 20 against 110
        "e.py": "spark-lane-0",  # unweighted (DEFAULT_WEIGHT); a tie goes to the first lane
    }
    assert set(assign_lanes(["a.py", "b.py"], weights, 0).values()) == {"spark-lane-0"}  # at least one


def _two_workers(config, monkeypatch) -> None:
    """What ``-n 2`` tells xdist's scheduler (this test runs in one process)."""
    monkeypatch.setattr(config.option, "tx", ["2*popen"], raising=False)


def test_only_the_spark_modules_share_a_work_unit(pytestconfig, tmp_path, monkeypatch):
    _two_workers(pytestconfig, monkeypatch)
    monkeypatch.setenv("COMPACTMQ_SPARK_LANES", "1")
    path = str(tmp_path / "spark")
    write_spark_modules(path, ["tests/x/test_s1.py", "tests/x/test_s2.py"])
    sched = SparkLaneScheduling(pytestconfig, modules_file=path, weights={})
    scopes = {
        sched._split_scope(nodeid)
        for nodeid in ("tests/x/test_s1.py::test_a", "tests/x/test_s2.py::test_b[p]")
    }
    assert scopes == {"spark-lane-0"}
    assert sched._split_scope("tests/x/test_plain.py::test_c") == "tests/x/test_plain.py"


def test_no_file_from_the_workers_is_plain_loadfile(pytestconfig, tmp_path, monkeypatch):
    _two_workers(pytestconfig, monkeypatch)
    sched = SparkLaneScheduling(pytestconfig, modules_file=str(tmp_path / "absent"), weights={})
    assert sched._split_scope("tests/x/test_s1.py::test_a") == "tests/x/test_s1.py"
