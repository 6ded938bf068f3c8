"""Topics as Spark tables: the ``compactmq`` data source (Spark 4's Python Data Source API).

Register it once per session, then use it like any format::

    import compactmq.spark
    compactmq.spark.register(spark)
    df = (spark.read.format("compactmq")
          .option("service.url", "pulsar://broker:6650").option("admin.url", "http://broker:8080")
          .option("topic", "prices").option("view", "latest")
          .load())

On a cluster, executors import ``compactmq`` in their Python workers: install the package on every
node (or ship it: ``spark-submit --py-files compactmq.zip``, or ``spark.addArtifact`` with Spark
Connect) and call ``register(spark)`` in the driver program; nothing else (no JVM jar) is needed.

Views (option ``view``):

* ``raw`` (default): every message in the range, as a plain reader receives it.
* ``compacted``: the compacted view as the broker serves it to read-compacted consumers.
* ``latest``: one row per live key: the compacted view plus the not-yet-compacted tail folded per
  key with the topic's compaction strategy (right even before compaction ever ran).
  ``includeTombstones=true`` adds a row with a null value for each deleted key still known.

Reads go through the broker (``service.url`` and, for splitting by ledger and schemas,
``admin.url``), or, the fast path, straight to the files of a data directory this job can see
(``path`` / ``load(path)``, read-only, beside a running broker). Modules: ``options`` (parsing),
``plan`` (splits), ``direct`` and ``broker`` (the two backends), ``compacted_view`` (the one place
that reads compaction's output), ``entry_columns`` and ``arrow_columns`` (entries straight to
Arrow columns: the direct path's raw and compacted splits), ``messages`` and ``values`` (entries
to rows, then Arrow: ``latest`` and the official client's path), ``broker_entries`` (whole entries
through the broker, parsed as columns; ``entry_stream`` receives them in bulk, ``broker_connect``
opens its TLS and authenticated connection), ``pushdown`` (filters Spark pushes) and ``prune`` (what
they let the planner skip), ``source``
(the batch reader), ``stream`` (the streaming reader), ``writer`` (batch and streaming writes),
``export`` (the compacted view as a Parquet / Delta / Iceberg table).
"""

from __future__ import annotations

FORMAT = "compactmq"


PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
_SCAN_BUILDER = "org.apache.spark.sql.execution.datasources.v2.python.PythonScanBuilder"


def pushdown_is_scan_scoped(spark) -> bool:
    """Whether this Spark keeps what a filtered scan of a Python data source planned to that scan.

    Spark up to at least 4.3.0 stores the partitions and read function that filter pushdown plans
    on the data source object a DataFrame holds, and a later scan of the same DataFrame whose
    query pushes no filter reuses them: ``df.where("__key = 'a'").count()`` then ``df.count()``
    counts only key ``a``. Later Spark keeps them on the scan builder (a field ``readInfo`` of
    ``PythonScanBuilder``), which is what this looks for (through the JVM gateway; False when
    there is none, e.g. Spark Connect)."""
    try:
        cls = spark._jvm.java.lang.Class.forName(_SCAN_BUILDER)
        return any(f.getName() == "readInfo" for f in cls.getDeclaredFields())
    except Exception:  # noqa: BLE001 - no JVM gateway, another Spark: assume the old behaviour
        return False


def register(spark, pushdown: bool | None = None) -> None:
    """Register the ``compactmq`` format in ``spark`` (a SparkSession).

    With pushdown, filters on ``__key``, ``__publishTime``, ``__eventTime`` and ``__messageId``
    are pushed into the source (``pushdown``, ``prune``); this turns Spark's
    ``spark.sql.python.filterPushdown.enabled`` on for the session, without which Spark refuses a
    Python source that takes filters. ``pushdown=None`` (the default) turns it on only where Spark
    keeps a pushed plan to its own scan (``pushdown_is_scan_scoped``); ``True`` turns it on
    anyway -- then use a DataFrame for one filtered query only (``load()`` again for the next),
    or a later unfiltered query of it returns the filtered rows."""
    import logging

    from .source import CompactMQDataSource, CompactMQPushdownDataSource

    scoped = pushdown_is_scan_scoped(spark)
    if pushdown is None:
        pushdown = scoped
    elif pushdown and not scoped:
        logging.getLogger(__name__).warning(
            "compactmq: filter pushdown forced on a Spark that reuses a filtered scan's plan for "
            "later unfiltered scans of the same DataFrame: load() a DataFrame per filtered query"
        )
    if pushdown:
        spark.conf.set(PUSHDOWN_CONF, "true")
        spark.dataSource.register(CompactMQPushdownDataSource)
    else:
        spark.dataSource.register(CompactMQDataSource)


__all__ = ["FORMAT", "pushdown_is_scan_scoped", "register"]
