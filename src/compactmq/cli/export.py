"""``compactmq topics export-compacted T --path URI --format parquet|delta|iceberg``.

Writes the compacted view (or ``--view latest``) of a topic as a columnar table through
``compactmq.spark.export``. It reads through the broker (``--service-url`` and the global
``--admin-url``) or, with ``--data-dir``, straight from a data directory this machine can see.
Spark runs locally in this process (``compaction.jobs.session``).
"""

from __future__ import annotations

import argparse
import re

from ..errors import CompactMQError


class ExportFailed(CompactMQError):
    """The export's Spark read failed; the message is the underlying reason, on one line."""


def add_commands(topics) -> None:
    """Add ``export-compacted`` to the ``topics`` subcommands."""
    p = topics.add_parser(
        "export-compacted", help="write the compacted view as a Parquet/Delta/Iceberg table"
    )
    p.add_argument("topic")
    p.add_argument("--path", required=True, help="table location (directory or URI)")
    p.add_argument(
        "--format", dest="table_format", choices=("parquet", "delta", "iceberg"), default="parquet"
    )
    p.add_argument("--partition-by", default="", help="comma-separated columns to partition the table by")
    p.add_argument("--view", choices=("compacted", "latest"), default="compacted")
    p.add_argument(
        "--strategy-classes",
        default="",
        help="comma-separated strategy classes a --view latest read may import when the topic's "
        "compactionStrategy policy names one (default: built-ins only)",
    )
    p.add_argument(
        "--service-url", default="pulsar://127.0.0.1:6650", help="the broker's binary protocol URL"
    )
    p.add_argument("--data-dir", default=None, help="read ledger files from this data directory instead")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..compaction.jobs.session import get_session
    from ..spark.export import export_compacted

    if args.data_dir:
        options = {"path": args.data_dir}
    else:
        options = {"service.url": args.service_url, "admin.url": args.admin_url}
    if args.strategy_classes:
        options["compactionStrategyClasses"] = args.strategy_classes
    partition_by = [c.strip() for c in args.partition_by.split(",") if c.strip()]
    try:
        message = export_compacted(
            get_session(),
            args.topic,
            args.path,
            args.table_format,
            view=args.view,
            partition_by=partition_by,
            options=options,
        )
    except CompactMQError:
        raise
    except Exception as e:  # noqa: BLE001 - Spark wraps the source's error in a long JVM message
        raise ExportFailed(reason(e)) from None
    print(message)
    return 0


def reason(error: BaseException) -> str:
    """The innermost ``SomethingError: message`` line of a (Spark-wrapped) error, else its first line."""
    lines = re.findall(
        r"^\s*(?:[\w.]+\.)?(\w+(?:Error|NotFound|Configuration|Loss|Exception)): (.+)$",
        str(error),
        re.MULTILINE,
    )
    if lines:
        name, text = lines[-1]
        return f"{name}: {text.strip()}"
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
