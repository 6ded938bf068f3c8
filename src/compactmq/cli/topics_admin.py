"""``compactmq topics create|list|delete|stats|internal-stats`` and their partitioned forms
(``partitioned-stats [--per-partition]``, ``partitioned-stats-internal``, as pulsar-admin): a
topic's lifecycle and what the broker reports about it, one REST call each."""

from __future__ import annotations

from .admin_client import namespace_path, run_command, topic_path


def _namespace_of_topics_arg(ns: str) -> str:
    return namespace_path(ns).replace("/admin/v2/namespaces/", "/admin/v2/persistent/")


def _create(a, c, o) -> None:
    c.request("PUT", topic_path(a.topic))
    o.done(f"created {a.topic}")


def _create_partitioned(a, c, o) -> None:
    c.request("PUT", f"{topic_path(a.topic)}/partitions", a.partitions)
    o.done(f"created {a.topic} with {a.partitions} partitions")


def _delete(a, c, o) -> None:
    c.request("DELETE", topic_path(a.topic), query={"force": "true"} if a.force else None)
    o.done(f"deleted {a.topic}")


def _delete_partitioned(a, c, o) -> None:
    c.request("DELETE", f"{topic_path(a.topic)}/partitions", query={"force": "true"} if a.force else None)
    o.done(f"deleted {a.topic}")


def _partitioned_stats(a, c, o) -> None:
    query = {"perPartition": "true" if a.per_partition else "false"}
    o.result(c.request("GET", f"{topic_path(a.topic)}/partitioned-stats", query=query))


def add_commands(topics) -> None:
    """Add the topic lifecycle and stats commands to the ``topics`` sub-parser."""
    p = topics.add_parser("create", help="create a non-partitioned topic")
    p.add_argument("topic")
    p.set_defaults(func=run_command(_create))
    p = topics.add_parser("create-partitioned-topic", help="create a partitioned topic")
    p.add_argument("topic")
    p.add_argument("-p", "--partitions", type=int, required=True)
    p.set_defaults(func=run_command(_create_partitioned))
    p = topics.add_parser("list", help="list the topics of a namespace")
    p.add_argument("namespace", help="tenant/namespace")
    p.set_defaults(
        func=run_command(lambda a, c, o: o.result(c.request("GET", _namespace_of_topics_arg(a.namespace))))
    )
    p = topics.add_parser("list-partitioned-topics", help="list the partitioned topics of a namespace")
    p.add_argument("namespace", help="tenant/namespace")
    p.set_defaults(
        func=run_command(
            lambda a, c, o: o.result(c.request("GET", _namespace_of_topics_arg(a.namespace) + "/partitioned"))
        )
    )
    p = topics.add_parser("delete", help="delete a topic")
    p.add_argument("topic")
    p.add_argument("-f", "--force", action="store_true", help="delete even with producers/consumers attached")
    p.set_defaults(func=run_command(_delete))
    p = topics.add_parser("delete-partitioned-topic", help="delete a partitioned topic and its partitions")
    p.add_argument("topic")
    p.add_argument("-f", "--force", action="store_true")
    p.set_defaults(func=run_command(_delete_partitioned))
    p = topics.add_parser("stats", help="show a topic's stats, including compaction")
    p.add_argument("topic")
    p.set_defaults(
        func=run_command(lambda a, c, o: o.result(c.request("GET", f"{topic_path(a.topic)}/stats")))
    )
    p = topics.add_parser(
        "internal-stats",
        aliases=["stats-internal"],
        help="show ledgers, cursors, compacted ledger and horizon",
    )
    p.add_argument("topic")
    p.set_defaults(
        func=run_command(lambda a, c, o: o.result(c.request("GET", f"{topic_path(a.topic)}/internalStats")))
    )
    p = topics.add_parser(
        "partitioned-stats",
        help="stats of a partitioned topic, its partitions summed (from each partition's owner)",
    )
    p.add_argument("topic")
    p.add_argument("--per-partition", action="store_true", help="each partition's stats too")
    p.set_defaults(func=run_command(_partitioned_stats))
    p = topics.add_parser(
        "partitioned-stats-internal", help="internal stats of each partition of a partitioned topic"
    )
    p.add_argument("topic")
    p.set_defaults(
        func=run_command(
            lambda a, c, o: o.result(c.request("GET", f"{topic_path(a.topic)}/partitioned-internalStats"))
        )
    )
