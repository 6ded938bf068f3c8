"""The compacted view (or the latest state) of a topic as a columnar table: Parquet, Delta or Iceberg.

PIP-278 names the step: "writing the compacted data anywhere, S3, in columnar format". The rows are
read with the ``compactmq`` Spark source (same columns: the value or the schema's fields, then the
``__`` metadata columns; ``view`` compacted or latest), gathered as Arrow on the driver (a compacted
view is one row per key) and written with a table library that needs no JVM:

* Parquet: ``pyarrow.parquet`` (a dataset directory, Hive-partitioned with ``partition_by``);
* Delta: ``deltalake`` (delta-rs), the maintained Delta writer that installs from PyPI;
* Iceberg: ``pyiceberg`` with its SQL catalog in a SQLite file under the path (``catalog.db``,
  table ``compactmq.<topic>``), so the table is self-contained.

An export replaces the table's contents with the current view (the view is a snapshot, not a log),
incrementally where the format allows: an existing Delta table is MERGEd on ``__messageId`` (rows of
changed keys inserted, vanished ones deleted, the rest untouched); an existing Iceberg table gets a
new snapshot (``overwrite``); Parquet is rewritten as a new version directory that ``path`` (a
symbolic link) is switched to, so an export never deletes a directory it did not create
(``write_parquet_version``).
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
    return SqlCatalog(
        "compactmq",
        uri=f"sqlite:///{os.path.abspath(path)}/catalog.db",
        warehouse=f"file://{os.path.abspath(path)}",
    )


def write_table(table, path: str, fmt: str, partition_by: Sequence[str] = (), topic: str = "") -> str:
    """Write ``table`` (pyarrow) to ``path`` as ``fmt``; returns what was written (for the CLI)."""
    missing = [c for c in partition_by if c not in table.column_names]
    if missing:
        raise InvalidConfiguration(
            f"--partition-by {','.join(missing)}: no such column (columns: {', '.join(table.column_names)})"
        )
    if fmt == "parquet":
        if "://" in path:  # an object store: pyarrow refuses to write over existing data
            _write_parquet(table, path, partition_by)
        else:
            write_parquet_version(table, path, partition_by)
        return f"{table.num_rows} rows to Parquet dataset {path}"
    if fmt == "delta":
        from deltalake import DeltaTable, write_deltalake

        if DeltaTable.is_deltatable(path) and _same_layout(DeltaTable(path), table, partition_by):
            return _merge_delta(DeltaTable(path), table, path)
        write_deltalake(
            path, table, mode="overwrite", partition_by=list(partition_by) or None, schema_mode="overwrite"
        )
        return f"{table.num_rows} rows to Delta table {path}"
    if fmt == "iceberg":
        catalog = iceberg_catalog(path)
        name = iceberg_table_name(topic)
        catalog.create_namespace_if_not_exists(ICEBERG_NAMESPACE)
        if catalog.table_exists(name):
            ice = catalog.load_table(name)
            spec = [f.name for f in ice.spec().fields]
            if spec == list(partition_by) and ice.schema().as_arrow().names == table.column_names:
                ice.overwrite(table)  # a new snapshot of the same table: readers keep their history
                return (
                    f"{table.num_rows} rows to Iceberg table {name} (new snapshot, catalog {path}/catalog.db)"
                )
            catalog.drop_table(name)
        ice = catalog.create_table(name, schema=table.schema)
        if partition_by:
            with ice.update_spec() as spec:
                for column in partition_by:
                    spec.add_identity(column)
        ice.append(table)
        return f"{table.num_rows} rows to Iceberg table {name} (catalog {path}/catalog.db)"
    raise InvalidConfiguration(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")


def _write_parquet(table, path: str, partition_by: Sequence[str], existing: str = "error") -> None:
    import pyarrow.dataset as ds

    ds.write_dataset(
        table,
        path,
        format="parquet",
        partitioning=list(partition_by) or None,
        partitioning_flavor="hive" if partition_by else None,
        existing_data_behavior=existing,
    )


#: written first into every Parquet version directory an export creates: the proof, checked
#: before a version is deleted, that the export made it (a dot file: readers skip it)
VERSION_MARKER = ".compactmq-export"


def versions_dir(path: str) -> str:
    """Where the versions of the Parquet table at ``path`` live: a directory of their own beside
    it (``.<name>.versions``); ``path`` itself is a symbolic link to the version in force."""
    parent, name = os.path.split(os.path.abspath(path))
    return os.path.join(parent, f".{name}.versions")


def write_parquet_version(table, path: str, partition_by: Sequence[str] = ()) -> str:
    """Rewrite the Parquet table at ``path`` without deleting anything the export did not create:
    the rows go to a new version directory (marked), ``path`` is switched to it atomically (a
    symbolic link replaced by ``rename``), then older versions *carrying the marker* are removed.
    A reader opening ``path`` sees the old version or the new one, never half of one. A ``path``
    that exists and is not such a link was not made by an export: refused, left untouched."""
    import shutil
    import time

    if os.path.lexists(path) and not os.path.islink(path):
        raise InvalidConfiguration(
            f"{path} exists and was not written by a compacted export; move it away (an export never "
            "deletes what it did not create)"
        )
    versions = versions_dir(path)
    os.makedirs(versions, exist_ok=True)
    version = os.path.join(versions, f"v{time.time_ns()}")
    os.makedirs(version)
    with open(os.path.join(version, VERSION_MARKER), "w"):
        pass
    _write_parquet(table, version, partition_by, "overwrite_or_ignore")  # it holds only the marker
    link = f"{version}.link"
    os.symlink(version, link)
    os.replace(link, path)  # the switch
    for entry in os.listdir(versions):
        old = os.path.join(versions, entry)
        if old == version or os.path.islink(old) or not os.path.isdir(old):
            continue
        if os.path.isfile(os.path.join(old, VERSION_MARKER)):
            shutil.rmtree(old, ignore_errors=True)
    return version


def _same_layout(dt, table, partition_by: Sequence[str]) -> bool:
    meta = dt.metadata()
    names = [f.name for f in dt.schema().fields]
    return list(meta.partition_columns) == list(partition_by) and names == table.column_names


def _merge_delta(dt, table, path: str) -> str:
    """Re-export as a Delta MERGE on ``__messageId``: a compaction keeps a surviving message's id, so
    only the rows of changed keys are inserted, and rows no longer in the view are deleted; the
    unchanged rows (most of a large table) are not rewritten beyond their files' share."""
    stats = (
        dt.merge(table, predicate="t.__messageId = s.__messageId", source_alias="s", target_alias="t")
        .when_not_matched_insert_all()
        .when_not_matched_by_source_delete()
        .execute()
    )
    return (
        f"{table.num_rows} rows in Delta table {path} (merged: {stats.get('num_target_rows_inserted', 0)} "
        f"inserted, {stats.get('num_target_rows_deleted', 0)} deleted)"
    )


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


def export_compacted(
    spark,
    topic: str,
    path: str,
    fmt: str,
    *,
    view: str = "compacted",
    partition_by: Sequence[str] = (),
    options: dict | None = None,
) -> str:
    if view not in ("compacted", "latest"):
        raise InvalidConfiguration(f"--view {view!r}: use compacted or latest")
    table = read_view(spark, topic, dict(options or {}), view)
    return write_table(table, path, fmt, partition_by, topic)
