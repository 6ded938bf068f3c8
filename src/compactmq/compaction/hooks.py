"""What runs after a successful compaction, and the ``compactedExport`` policy that asks for it.

The broker's compaction monitor calls every *post-compaction hook* it was given, in the worker
thread of the run, after the new compacted view is committed: ``hook(storage, config, topic,
result)``. A hook that raises is logged and never fails the compaction. The broker knows hooks
only by this interface; the entry point (``cli.standalone``) wires the real ones in, so the broker
(layer 4) never imports the adapters (layer 5) that implement them, such as the Spark exporter
(``spark.auto_export``), which re-exports the compacted view as a columnar table.

The ``compactedExport`` policy (a topic or namespace policy; Pulsar has no such policy, the name
is ours) names that table::

    {"path": "/data/tables/prices",   # table location; for a namespace policy, the base
                                      # directory: each topic gets <path>/<topic's local name>
     "format": "delta",               # parquet (default) | delta | iceberg
     "view": "compacted",             # compacted (default) | latest
     "partitionBy": ["__key"]}        # optional

A topic's own policy wins over its namespace's. ``parse_export_policy`` validates a body
(``InvalidInput`` with one clear line); ``applied_export_policy`` finds the one in force.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ..errors import InvalidInput

POLICY_KEY = "compactedExport"
EXPORT_FORMATS = ("parquet", "delta", "iceberg")
EXPORT_VIEWS = ("compacted", "latest")


class PostCompactionHook(Protocol):
    def __call__(self, storage: Any, config: Any, topic: str, result: Any) -> None: ...


def parse_export_policy(body: Any) -> dict[str, Any]:
    """The normalized policy of a REST body (``{"path", "format", "view", "partitionBy"}``)."""
    if not isinstance(body, Mapping):
        raise InvalidInput(
            'compactedExport must be a JSON object {"path": ..., "format": "parquet|delta|iceberg", '
            '"view": "compacted|latest", "partitionBy": [...]}'
        )
    unknown = sorted(set(body) - {"path", "format", "view", "partitionBy"})
    if unknown:
        raise InvalidInput(f"compactedExport: unknown field(s) {', '.join(unknown)}")
    path = body.get("path")
    if not isinstance(path, str) or not path.strip():
        raise InvalidInput("compactedExport: path (the table location) is required")
    fmt = body.get("format", "parquet")
    if fmt not in EXPORT_FORMATS:
        raise InvalidInput(f"compactedExport: format must be one of {', '.join(EXPORT_FORMATS)}, not {fmt!r}")
    view = body.get("view", "compacted")
    if view not in EXPORT_VIEWS:
        raise InvalidInput(f"compactedExport: view must be compacted or latest, not {view!r}")
    partition_by = body.get("partitionBy", [])
    if isinstance(partition_by, str):
        partition_by = [c.strip() for c in partition_by.split(",") if c.strip()]
    if not isinstance(partition_by, list) or not all(isinstance(c, str) and c for c in partition_by):
        raise InvalidInput("compactedExport: partitionBy must be a list of column names")
    return {"path": path.strip(), "format": fmt, "view": view, "partitionBy": partition_by}


def applied_export_policy(metadata: Any, topic: str) -> tuple[dict[str, Any], str] | None:
    """``(policy, scope)`` in force for ``topic`` (scope ``"topic"`` or ``"namespace"``), or None."""
    from ..naming import TopicName

    own = metadata.get_topic_policies(topic).get(POLICY_KEY)
    if own:
        return dict(own), "topic"
    ns = metadata.get_namespace_policies(TopicName.parse(topic).namespace_name).get(POLICY_KEY)
    if ns:
        return dict(ns), "namespace"
    return None
