"""The ``compactedExport`` policy: after every successful compaction the broker re-exports the
compacted view (the Spark exporter, wired into the broker's post-compaction hooks by
``compactmq standalone``). Set with the CLI and REST, compaction triggered over REST, the table read
back with pyarrow / deltalake until it shows the compacted view the official client reads."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import pytest

from compactmq.cli.main import main

from .helpers import produce, read_all

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@pytest.fixture(scope="module")
def export_root(tmp_path_factory):
    return tmp_path_factory.mktemp("exports")


@pytest.fixture(scope="module")
def broker(tmp_path_factory, export_root):
    """The Spark tests' broker, with an export root: tables go only under it (docs/security.md).
    It runs in this process: its compaction and exporter use the worker's warm SparkSession."""
    from harness.broker import InProcessBroker

    b = InProcessBroker(
        tmp_path_factory.mktemp("broker") / "data",
        {
            "defaultRetentionTimeInMinutes": "-1",
            "defaultRetentionSizeInMB": "-1",
            "compactedExportRoot": str(export_root),
        },
    )
    b.start()
    yield b
    b.stop()


def location(root, topic: str) -> str:
    from compactmq.storage.topic_paths import topic_relpath

    return os.path.join(os.path.realpath(root), topic_relpath(topic))


def rest(broker, method, path, body=None):
    req = urllib.request.Request(
        f"http://127.0.0.1:{broker.web_port}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        data = resp.read()
        return json.loads(data) if data else None


def compacted_pairs(client, topic):
    return sorted((k, v) for k, v, *_ in read_all(client, topic, compacted=True))


def table_pairs(path, fmt):
    from compactmq.spark.export import read_back

    try:
        d = read_back(path, fmt).to_pydict()
    except Exception:  # noqa: BLE001 - not written yet
        return None
    return sorted((k, bytes(v) if v else b"") for k, v in zip(d["__key"], d["value"]))


def compact_and_wait(broker, client, topic, path, fmt, timeout=240.0):
    rest(broker, "PUT", f"/admin/v2/{topic.replace('://', '/', 1)}/compaction")
    expected = None
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        if expected is None:  # the compacted view the broker serves once the run has committed
            status = rest(broker, "GET", f"/admin/v2/{topic.replace('://', '/', 1)}/compaction")
            if status.get("status") == "SUCCESS":
                expected = compacted_pairs(client, topic)
        got = table_pairs(path, fmt)
        if expected is not None and got == expected:
            return expected
        time.sleep(0.2)
    raise AssertionError(
        f"the {fmt} table at {path} never showed the compacted view: {got} != {expected}; "
        f"log: {broker.log_path.read_text()[-2000:]}"
    )


def test_policy_re_exports_after_each_compaction(spark_in_broker, broker, client, export_root, capsys):
    # Spark runs in the broker (its compaction and the exporter, on the worker's SparkSession);
    # the test reads the tables back with pyarrow / deltalake, not with Spark
    from deltalake import DeltaTable

    admin = f"http://127.0.0.1:{broker.web_port}"
    ns = f"public/exports{time.monotonic_ns()}"
    rest(broker, "PUT", f"/admin/v2/namespaces/{ns}")
    base = os.path.dirname(location(export_root, f"persistent://{ns}/x"))
    assert main(["--admin-url", admin, "namespaces", "set-compacted-export", ns]) == 0
    assert rest(broker, "GET", f"/admin/v2/namespaces/{ns}/compactedExport") == {
        "path": base,
        "format": "parquet",
        "view": "compacted",
        "partitionBy": [],
    }
    capsys.readouterr()
    assert main(["--admin-url", admin, "namespaces", "get-compacted-export", ns]) == 0
    assert f"compacted view as parquet at {base}" in capsys.readouterr().out

    # a namespace policy: each topic's table at its derived location, Parquet rewritten
    topic = f"persistent://{ns}/prices"
    produce(
        client, topic, [(f"k{i % 7}", f"v{i}".encode() if i % 5 else b"") for i in range(60)], batching=True
    )
    compact_and_wait(broker, client, topic, location(export_root, topic), "parquet")

    # a topic policy wins over the namespace's: Delta, merged on re-export
    other = f"persistent://{ns}/quotes"
    delta = location(export_root, other)
    rest(broker, "PUT", f"/admin/v2/{other.replace('://', '/', 1)}")
    rest(broker, "POST", f"/admin/v2/{other.replace('://', '/', 1)}/compactedExport", {"format": "delta"})
    produce(client, other, [(f"q{i % 10}", f"a{i}".encode()) for i in range(50)])
    compact_and_wait(broker, client, other, delta, "delta")
    produce(client, other, [("q1", b"b1"), ("q2", b""), ("q42", b"b42")])
    compact_and_wait(broker, client, other, delta, "delta")
    assert DeltaTable(delta).history(1)[0]["operation"] == "MERGE"
    assert not os.path.islink(delta)  # not the namespace policy's Parquet table


def test_bad_policy_is_a_clear_error(broker):
    with pytest.raises(urllib.error.HTTPError) as e:
        rest(
            broker,
            "POST",
            "/admin/v2/namespaces/public/default/compactedExport",
            {"path": "/x", "format": "csv"},
        )
    assert e.value.code == 400
    assert "format must be one of parquet, delta, iceberg" in json.loads(e.value.read())["reason"]
