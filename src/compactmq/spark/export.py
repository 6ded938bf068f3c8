"""The compacted view (or the latest state) of a topic as a columnar table: Parquet, Delta or Iceberg.

PIP-278 names the step: "writing the compacted data anywhere, S3, in columnar format". The rows are
read with the ``compactmq`` Spark source (same columns: the value or the schema's fields, then the
``__`` metadata columns; ``view`` compacted or latest), gathered as Arrow on the driver (a compacted
view is one row per key) and written with a table library that needs no JVM:

* Parquet: ``pyarrow.parquet`` (a dataset directory, Hive-partitioned with ``partition_by``);
* Delta: ``deltalake`` (delta-rs), the maintained Delta writer that installs from PyPI;
* Iceberg: ``pyiceberg`` with its SQL catalog in a SQLite file under the path (``catalog.db``,
  table ``compactmq.<topic>``), so the table is self-contained.

An export replaces the table's contents with the current view (the view is a snapshot, not a log).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from ..errors import InvalidConfiguration

FORMATS = ("parquet", "delta", "iceberg")
ICEBERG_NAMESPACE = "compactmq"


def read_view(spark, topic: str, options: dict, view: str = "compacted"):
    """The view of ``topic`` as a ``pyarrow.Table`` (options: service.url/admin.url or path)."""
    from . import register

    register(spark)
    reader = spark.read.format("compactmq").option("topic", topic).option("view", view)
    for k, v in options.items():
        if v is not None:
            reader = reader.option(k, v)
    return reader.load().toArrow()


def iceberg_table_name(topic: str) -> str:
    local = topic.rsplit("/", 1)[-1]
    return f"{ICEBERG_NAMESPACE}." + re.sub(r"[^A-Za-z0-9_]", "_", local)


def iceberg_catalog(path: str):
    from pyiceberg.catalog.sql import SqlCatalog

    os.makedirs(path, exist_ok=True)
    return SqlCatalog("compactmq", uri=f"sqlite:///{os.path.abspath(path)}/catalog.db",
                      warehouse=f"file://{os.path.abspath(path)}")


def write_table(table, path: str, fmt: str, partition_by: Sequence[str] = (), topic: str = "") -> str:
    """Write ``table`` (pyarrow) to ``path`` as ``fmt``; returns what was written (for the CLI)."""
    missing = [c for c in partition_by if c not in table.column_names]
    if missing:
        raise InvalidConfiguration(f"--partition-by {','.join(missing)}: no such column "
                                   f"(columns: {', '.join(table.column_names)})")
    if fmt == "parquet":
        import shutil

        import pyarrow.dataset as ds

        if os.path.isdir(path):
            shutil.rmtree(path)
        ds.write_dataset(table, path, format="parquet", partitioning=list(partition_by) or None,
                         partitioning_flavor="hive" if partition_by else None)
        return f"{table.num_rows} rows to Parquet dataset {path}"
    if fmt == "delta":
        from deltalake import write_deltalake

        write_deltalake(path, table, mode="overwrite", partition_by=list(partition_by) or None,
                        schema_mode="overwrite")
        return f"{table.num_rows} rows to Delta table {path}"
    if fmt == "iceberg":
        catalog = iceberg_catalog(path)
        name = iceberg_table_name(topic)
        catalog.create_namespace_if_not_exists(ICEBERG_NAMESPACE)
        if catalog.table_exists(name):
            catalog.drop_table(name)
        ice = catalog.create_table(name, schema=table.schema)
        if partition_by:
            with ice.update_spec() as spec:
                for column in partition_by:
                    spec.add_identity(column)
        ice.append(table)
        return f"{table.num_rows} rows to Iceberg table {name} (catalog {path}/catalog.db)"
    raise InvalidConfiguration(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")


def read_back(path: str, fmt: str, topic: str = ""):
    """The exported table as a ``pyarrow.Table`` (what a reader without Spark gets)."""
    if fmt == "parquet":
        import pyarrow.dataset as ds

        # "__key=..." directories start with "_", which pyarrow skips by default
        return ds.dataset(path, format="parquet", partitioning="hive", ignore_prefixes=["."]).to_table()
    if fmt == "delta":
        from deltalake import DeltaTable

        return DeltaTable(path).to_pyarrow_table()
    if fmt == "iceberg":
        return iceberg_catalog(path).load_table(iceberg_table_name(topic)).scan().to_arrow()
    raise InvalidConfiguration(f"format {fmt!r}: use one of {', '.join(FORMATS)}")


def export_compacted(spark, topic: str, path: str, fmt: str, *, view: str = "compacted",
                     partition_by: Sequence[str] = (), options: dict | None = None) -> str:
    if view not in ("compacted", "latest"):
        raise InvalidConfiguration(f"--view {view!r}: use compacted or latest")
    table = read_view(spark, topic, dict(options or {}), view)
    return write_table(table, path, fmt, partition_by, topic)
