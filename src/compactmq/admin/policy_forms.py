"""How the ``compactmq`` CLI spells a policy: pulsar-admin's verb, its flags, the REST body it
builds from them, and the one line it prints for the broker's answer.

A ``CliForm`` is part of a policy's declaration (``policies.POLICIES``); the CLI turns each into
``set-<verb>``, ``get-<verb>`` and ``remove-<verb>`` (``clear-`` for a few) under ``topics`` and
``namespaces`` (``cli/policy_commands``). It lives in the admin package, beside the REST side of
the same declaration, and is stdlib only so that the CLI starts fast.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

from ..config import parse_bool
from .units import format_bytes, parse_duration_seconds, parse_size


@dataclass(frozen=True)
class CliForm:
    """pulsar-admin's spelling of one policy."""

    verb: str  # e.g. "compaction-threshold" -> set-/get-/remove-compaction-threshold
    add_args: Callable[[argparse.ArgumentParser], None]  # the set- command's value flags
    body_from_args: Callable[[argparse.Namespace], Any]  # the REST body those flags make
    render: Callable[[Any], str]  # the broker's answer as one line of text
    topic_set_method: str = "POST"  # Pulsar sets topic policies with POST
    namespace_set_method: str = "POST"
    remove_verb: str = "remove"  # pulsar-admin says clear-... for a few
    helps: tuple[str, str, str] | None = None  # set/get/remove help, when the generic text is poor


def threshold_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-t",
        "--threshold",
        required=True,
        help="backlog size that triggers compaction, e.g. 100M (0 disables)",
    )


def render_threshold(body: Any) -> str:
    if body is None:
        return "no compaction threshold set"
    return (
        f"{body} bytes ({format_bytes(int(body))})" if int(body) > 0 else "0 (automatic compaction disabled)"
    )


def retention_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", required=True, help="retention size, e.g. 10G (-1: no limit, 0: none)")
    p.add_argument("--time", required=True, help="retention time, e.g. 3h or 7d (-1: forever, 0: none)")


def retention_body(a: argparse.Namespace) -> dict:
    size = parse_size(a.size)
    seconds = parse_duration_seconds(a.time)
    return {
        "retentionSizeInMB": size if size == -1 else size // (1024 * 1024),
        "retentionTimeInMinutes": seconds if seconds == -1 else seconds // 60,
    }


def render_retention(body: Any) -> str:
    if not body:
        return "no retention policy set"
    return (
        f"retentionTimeInMinutes={body.get('retentionTimeInMinutes')} "
        f"retentionSizeInMB={body.get('retentionSizeInMB')}"
    )


def lag_args(what: str) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("-l", "--lag", required=True, help=f"{what}, e.g. 90, 30m or 1h (0 disables)")

    return add


def lag_seconds(a: argparse.Namespace) -> int:
    return parse_duration_seconds(a.lag)


def render_seconds(body: Any) -> str:
    return "not set" if body is None else f"{body} s" if int(body) > 0 else "0 (disabled)"


def strategy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-s", "--strategy", required=True, help="keep-latest, keep-first, event-time, or a dotted class name"
    )


def null_key_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--retain",
        required=True,
        choices=("true", "false"),
        help="keep keyless messages in the compacted view",
    )


def enable_args(what: str) -> Callable[[argparse.ArgumentParser], None]:
    """pulsar-admin's ``-e/--enable | -d/--disable`` pair, one of them required."""

    def add(p: argparse.ArgumentParser) -> None:
        g = p.add_mutually_exclusive_group(required=True)
        g.add_argument("-e", "--enable", action="store_true", help=f"enable {what}")
        g.add_argument("-d", "--disable", action="store_true", help=f"disable {what}")

    return add


def enabled(a: argparse.Namespace) -> bool:
    return bool(a.enable)


def schema_strategy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-c",
        "--compatibility",
        required=True,
        help="ALWAYS_COMPATIBLE, ALWAYS_INCOMPATIBLE, BACKWARD, FORWARD, FULL, BACKWARD_TRANSITIVE, "
        "FORWARD_TRANSITIVE or FULL_TRANSITIVE",
    )


def export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root",
        default=None,
        help="an object-store root the broker allows (compactedExportObjectStoreRoots; Delta only); "
        "default: the broker's compactedExportRoot. The table's location under it is derived from "
        "the topic's name",
    )
    p.add_argument(
        "--format", dest="table_format", choices=("parquet", "delta", "iceberg"), default="parquet"
    )
    p.add_argument("--view", choices=("compacted", "latest"), default="compacted")
    p.add_argument("--partition-by", default="", help="comma-separated columns to partition the table by")


def export_body(a: argparse.Namespace) -> dict:
    body = {} if a.root is None else {"root": a.root}
    return body | {
        "format": a.table_format,
        "view": a.view,
        "partitionBy": [c.strip() for c in a.partition_by.split(",") if c.strip()],
    }


def render_export(b: Any) -> str:
    if not b:
        return "no compacted export set"
    by = f", partitioned by {','.join(b['partitionBy'])}" if b.get("partitionBy") else ""
    where = b.get("path") or "the broker's export root"
    return f"{b.get('view', 'compacted')} view as {b.get('format', 'parquet')} at {where}{by}"


def render_bool(b: Any) -> str:
    return "not set" if b is None else str(b).lower()


def not_set_or(b: Any) -> str:
    return "not set" if b is None else str(b).lower() if isinstance(b, bool) else str(b)


def retain_flag(a: argparse.Namespace) -> bool:
    return parse_bool(a.retain)
