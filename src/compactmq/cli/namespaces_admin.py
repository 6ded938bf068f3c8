"""``compactmq namespaces create|list|topics|delete``, and the namespace-only policy
``auto-topic-creation``; the policies namespaces share with topics come from ``policies_admin``."""

from __future__ import annotations

import argparse
from typing import Any

from ..admin.policies import CliForm
from ..config import policy_keys
from .admin_client import namespace_path, run_command


def _auto_topic_creation_body(a: argparse.Namespace) -> dict:
    body: dict[str, Any] = {"allowAutoTopicCreation": bool(a.enable), "topicType": a.type}
    if a.num_partitions is not None:
        body["defaultNumPartitions"] = a.num_partitions
    return body


def _render_auto_topic_creation(body: Any) -> str:
    if not body:
        return "not set (the broker settings apply)"
    if not body.get("allowAutoTopicCreation"):
        return "disabled"
    if body.get("topicType") == "partitioned":
        return f"enabled: partitioned, {body.get('defaultNumPartitions')} partitions"
    return f"enabled: {body.get('topicType', 'non-partitioned')}"


def _auto_topic_creation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-e", "--enable", action="store_true", help="allow automatic topic creation (default: forbid)"
    )
    p.add_argument(
        "-t",
        "--type",
        default="non-partitioned",
        choices=("partitioned", "non-partitioned"),
        help="type of the topics created",
    )
    p.add_argument(
        "-n",
        "--num-partitions",
        type=int,
        default=None,
        help="partitions of an auto-created partitioned topic",
    )


#: policies only a namespace has (pulsar-admin's verbs and flags)
NAMESPACE_POLICIES = (
    (
        policy_keys.AUTO_TOPIC_CREATION,  # its REST path is its key
        CliForm(
            "auto-topic-creation",
            _auto_topic_creation_args,
            _auto_topic_creation_body,
            _render_auto_topic_creation,
            helps=(
                "allow or forbid creating topics by using them",
                "show the automatic topic creation policy",
                "remove the policy (the broker settings apply)",
            ),
        ),
    ),
)


def _create(a, c, o) -> None:
    body = {"bundles": {"numBundles": a.bundles}} if a.bundles is not None else None
    c.request("PUT", namespace_path(a.namespace), body)
    o.done(f"created {a.namespace}")


def _delete(a, c, o) -> None:
    c.request("DELETE", namespace_path(a.namespace))
    o.done(f"deleted {a.namespace}")


def add_commands(namespaces) -> None:
    """Add the namespace lifecycle commands to the ``namespaces`` sub-parser."""
    p = namespaces.add_parser("create", help="create a namespace")
    p.add_argument("namespace", help="tenant/namespace")
    p.add_argument("-b", "--bundles", type=int, help="number of bundles (default: the broker's)")
    p.set_defaults(func=run_command(_create))
    p = namespaces.add_parser("list", help="list the namespaces of a tenant")
    p.add_argument("tenant")
    p.set_defaults(
        func=run_command(lambda a, c, o: o.result(c.request("GET", f"/admin/v2/namespaces/{a.tenant}")))
    )
    p = namespaces.add_parser("topics", help="list the topics of a namespace (every domain with --mode ALL)")
    p.add_argument("namespace", help="tenant/namespace")
    p.add_argument("-m", "--mode", default="PERSISTENT", choices=("PERSISTENT", "NON_PERSISTENT", "ALL"))
    p.set_defaults(
        func=run_command(
            lambda a, c, o: o.result(
                c.request("GET", f"{namespace_path(a.namespace)}/topics", query={"mode": a.mode})
            )
        )
    )
    p = namespaces.add_parser("delete", help="delete an empty namespace")
    p.add_argument("namespace", help="tenant/namespace")
    p.set_defaults(func=run_command(_delete))
