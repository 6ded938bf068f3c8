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
to rows, then Arrow: ``latest`` and the broker path), ``pushdown`` (filters Spark pushes), ``source``
(the batch reader), ``stream`` (the streaming reader), ``writer`` (batch and streaming writes),
``export`` (the compacted view as a Parquet / Delta / Iceberg table).
"""

from __future__ import annotations

FORMAT = "compactmq"


PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark, pushdown: bool = True) -> None:
    """Register the ``compactmq`` format in ``spark`` (a SparkSession).

    With ``pushdown`` (the default) filters on ``__key`` and ``__publishTime`` are pushed into
    the source (``pushdown``); this turns Spark's ``spark.sql.python.filterPushdown.enabled`` on
    for the session, without which Spark refuses a Python source that takes filters."""
    from .source import CompactMQDataSource, CompactMQPushdownDataSource

    if pushdown:
        spark.conf.set(PUSHDOWN_CONF, "true")
        spark.dataSource.register(CompactMQPushdownDataSource)
    else:
        spark.dataSource.register(CompactMQDataSource)


__all__ = ["FORMAT", "register"]
