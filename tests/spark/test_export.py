"""``compactmq topics export-compacted``: the compacted view (and the latest state) as Parquet, Delta
and Iceberg tables that read back through pyarrow equal to what a read-compacted reader receives."""

from __future__ import annotations

import pytest

from compactmq.cli.main import main

from .helpers import compact, latest_of, produce, read_all

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def pairs(table):
    d = table.to_pydict()
    return sorted(zip(d["__key"], [bytes(v) if v is not None else None for v in d["value"]]))


@pytest.mark.parametrize("fmt", ["parquet", "delta", "iceberg"])
def test_export_compacted_reads_back_equal(cmq_spark, broker, client, topic, tmp_path, fmt, capsys):
    from compactmq.spark.export import read_back

    items = [(f"k{i % 13}", f"v{i}".encode() if i % 9 else b"") for i in range(80)]
    produce(client, topic, items, batching=True)
    compact(broker, topic)
    expected = sorted((k, v) for k, v, *_ in read_all(client, topic, compacted=True))
    path = str(tmp_path / fmt)
    assert (
        main(
            [
                "--admin-url",
                f"http://127.0.0.1:{broker.web_port}",
                "topics",
                "export-compacted",
                topic,
                "--path",
                path,
                "--format",
                fmt,
                "--service-url",
                broker.url,
            ]
        )
        == 0
    )
    assert "rows to" in capsys.readouterr().out
    table = read_back(path, fmt, topic)
    assert [(k, v if v else b"") for k, v in pairs(table)] == expected
    # the latest state, partitioned by key, from the data directory; a re-export replaces the table
    assert (
        main(
            [
                "topics",
                "export-compacted",
                topic,
                "--path",
                path,
                "--format",
                fmt,
                "--view",
                "latest",
                "--partition-by",
                "__key",
                "--data-dir",
                str(broker.data_dir),
            ]
        )
        == 0
    )
    table = read_back(path, fmt, topic)
    assert dict(pairs(table)) == latest_of(items)
    assert table.num_rows == len(latest_of(items))


def test_delta_re_export_merges_changed_keys(cmq_spark, broker, client, topic, tmp_path):
    from deltalake import DeltaTable

    from compactmq.spark.export import export_compacted, read_back

    items = [(f"k{i % 10}", f"a{i}".encode()) for i in range(50)]
    produce(client, topic, items)
    compact(broker, topic)
    path, opts = str(tmp_path / "delta"), {"path": str(broker.data_dir)}
    export_compacted(cmq_spark, topic, path, "delta", options=opts)
    changes = [("k1", b"b1"), ("k2", b""), ("k42", b"b42")]
    produce(client, topic, changes)
    compact(broker, topic)
    message = export_compacted(cmq_spark, topic, path, "delta", options=opts)
    assert "merged" in message, message
    assert DeltaTable(path).history(1)[0]["operation"] == "MERGE"
    expected = sorted((k, v) for k, v, *_ in read_all(client, topic, compacted=True))
    assert [(k, v if v else b"") for k, v in pairs(read_back(path, "delta"))] == expected


def test_export_errors_are_one_line(cmq_spark, broker, tmp_path, capsys):
    missing = "persistent://public/default/no-such-topic"
    assert (
        main(
            [
                "topics",
                "export-compacted",
                missing,
                "--path",
                str(tmp_path / "t"),
                "--data-dir",
                str(broker.data_dir),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("compactmq: error: ") and "does not exist" in err and "\n" not in err, err
