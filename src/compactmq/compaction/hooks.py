"""What runs after a successful compaction, and the ``compactedExport`` policy that asks for it.

The broker's compaction monitor calls every *post-compaction hook* it was given, in the worker
thread of the run, after the new compacted view is committed: ``hook(storage, config, topic,
result)``. A hook that raises is logged and never fails the compaction. The broker knows hooks
only by this interface; the entry point (``cli.standalone``) wires the real ones in, so the broker
(layer 4) never imports the adapters (layer 5) that implement them, such as the Spark exporter
(``spark.auto_export``), which re-exports the compacted view as a columnar table.

The ``compactedExport`` policy (a topic or namespace policy; Pulsar has no such policy, the name
is ours) asks for that table::

    {"format": "delta",               # parquet (default) | delta | iceberg
     "view": "compacted",             # compacted (default) | latest
     "partitionBy": ["__key"],        # optional
     "root": "s3://tables/prod"}      # optional: one of compactedExportObjectStoreRoots

Where the table goes is not the user's choice (docs/security.md): it is
``<root>/<domain>/<tenant>/<namespace>/<topic>``, each part encoded as the data directory encodes
it (``storage.topic_paths.topic_relpath``), under the operator's ``compactedExportRoot`` (a local
directory, resolved with ``realpath``; unset: the policy is refused) or under one of the
``compactedExportObjectStoreRoots`` the policy names (Delta only: a Delta commit never deletes
files). ``export_location`` derives it, for the admin API when a policy is set and again for the
exporter at every run. A stored ``path`` is informational only.

A topic's own policy wins over its namespace's. ``parse_export_policy`` validates a body
(``InvalidInput`` with one clear line); ``applied_export_policy`` finds the one in force.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Protocol

from ..config import policy_keys
from ..errors import InvalidConfiguration, InvalidInput

POLICY_KEY = policy_keys.COMPACTED_EXPORT
EXPORT_FORMATS = ("parquet", "delta", "iceberg")
EXPORT_VIEWS = ("compacted", "latest")
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class PostCompactionHook(Protocol):
    def __call__(self, storage: Any, config: Any, topic: str, result: Any) -> None: ...


def parse_export_policy(body: Any) -> dict[str, Any]:
    """The normalized policy of a REST body (``{"format", "view", "partitionBy"}``, and ``root``
    or ``path`` when given: ``export_location`` checks those against the broker's config)."""
    if not isinstance(body, Mapping):
        raise InvalidInput(
            'compactedExport must be a JSON object {"format": "parquet|delta|iceberg", '
            '"view": "compacted|latest", "partitionBy": [...]}'
        )
    unknown = sorted(set(body) - {"path", "format", "view", "partitionBy", "root"})
    if unknown:
        raise InvalidInput(f"compactedExport: unknown field(s) {', '.join(u[:80] for u in unknown)}")
    out: dict[str, Any] = {}
    path = body.get("path")
    if path is not None:  # accepted only when it is the derived location (``export_location``)
        if not isinstance(path, str) or not path.strip() or len(path) > 4096:
            raise InvalidInput("compactedExport: path, when given, must be the derived location")
        out["path"] = path.strip()
    fmt = body.get("format", "parquet")
    if fmt not in EXPORT_FORMATS:
        raise InvalidInput(
            f"compactedExport: format must be one of {', '.join(EXPORT_FORMATS)}, not {fmt!r:.80}"
        )
    view = body.get("view", "compacted")
    if view not in EXPORT_VIEWS:
        raise InvalidInput(f"compactedExport: view must be compacted or latest, not {view!r:.80}")
    partition_by = body.get("partitionBy", [])
    if isinstance(partition_by, str):
        partition_by = [c.strip() for c in partition_by.split(",") if c.strip()]
    if (
        not isinstance(partition_by, list)
        or len(partition_by) > 16
        or not all(isinstance(c, str) and _COLUMN.match(c) for c in partition_by)
    ):
        raise InvalidInput(
            "compactedExport: partitionBy must be a list of at most 16 column names (letters, digits and _)"
        )
    root = body.get("root")
    if root is not None:
        if not isinstance(root, str) or not root.strip() or len(root) > 4096:
            raise InvalidInput(
                "compactedExport: root must be one of the broker's compactedExportObjectStoreRoots"
            )
        out["root"] = root.strip()
    out.update(format=fmt, view=view, partitionBy=partition_by)
    return out


def _object_roots(config: Any) -> list[str]:
    from ..config import config_list

    return [r.rstrip("/") for r in config_list(config, "compactedExportObjectStoreRoots")]


def _root(config: Any, policy: Mapping[str, Any]) -> tuple[str, bool]:
    """``(root, is_object_store)`` a policy exports under; ``InvalidConfiguration`` when the
    operator configured none, or the policy names a root the operator did not list."""
    chosen = policy.get("root")
    if chosen:
        roots = _object_roots(config)
        if str(chosen).rstrip("/") not in roots:
            raise InvalidConfiguration(
                f"compactedExport: root {str(chosen)[:200]!r} is not one of this broker's "
                f"compactedExportObjectStoreRoots ({', '.join(roots) or 'none configured'})"
            )
        if policy.get("format", "parquet") != "delta":
            raise InvalidConfiguration(
                "compactedExport: exports to an object-store root are Delta tables only "
                "(a Delta commit replaces a table without deleting what it did not write)"
            )
        return str(chosen).rstrip("/"), True
    local = str(config.get("compactedExportRoot") or "").strip()
    if not local:
        raise InvalidConfiguration(
            "compactedExport is disabled on this broker: the operator sets compactedExportRoot "
            "(the directory every export is written under) to enable it"
        )
    return os.path.realpath(local), False


def _under(root: str, rel: str, is_object_store: bool) -> str:
    parts = rel.replace(os.sep, "/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidConfiguration(f"compactedExport: the topic name does not give a safe location ({rel!r})")
    if is_object_store:
        return root + "/" + "/".join(parts)
    where = os.path.join(root, *parts)
    real = os.path.realpath(where)
    if os.path.commonpath([real, root]) != root:
        raise InvalidConfiguration(f"compactedExport: {where} resolves outside the export root {root}")
    return where


def export_location(config: Any, topic: str, policy: Mapping[str, Any]) -> str:
    """Where ``topic``'s table is written: ``<root>/<encoded domain/tenant/namespace/topic>``,
    checked with ``realpath`` to stay under the root (a symlink planted in the tree cannot lead
    it out); ``InvalidConfiguration`` when no root applies or the location leaves it."""
    from ..storage.topic_paths import topic_relpath

    root, is_object_store = _root(config, policy)
    return _under(root, topic_relpath(topic), is_object_store)


def export_namespace_location(config: Any, namespace: str, policy: Mapping[str, Any]) -> str:
    """The directory a namespace policy's tables go under (each topic's table inside it)."""
    from ..storage.topic_paths import topic_relpath

    root, is_object_store = _root(config, policy)
    rel = os.path.dirname(topic_relpath(f"persistent://{namespace}/x"))
    return _under(root, rel, is_object_store)


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
