"""What every topic path handler does first: its path pattern, the ``TopicName`` of its path
parameters, refusing a non-persistent topic where only persistent ones make sense, and telling a
partitioned topic (its partition count) from a non-partitioned one (0) from none (404).

Shared by the topic routes (``topics``), their stats (``topic_stats``) and offload (``offload``).
"""

from __future__ import annotations

from ..errors import NotAllowed, NotFound, TopicNotFound
from ..naming import TopicName
from .common import Context

TOPIC = "/admin/v2/{domain}/{tenant}/{namespace}/{topic}"
NAMESPACE = "/admin/v2/{domain}/{tenant}/{namespace}"


def topic_name(domain: str, tenant: str, namespace: str, topic: str) -> TopicName:
    return TopicName.parse(f"{domain}://{tenant}/{namespace}/{topic}")


def persistent_name(tn: TopicName) -> str:
    if not tn.persistent:
        raise NotAllowed(f"{tn}: non-persistent topics are not supported by compactmq")
    return str(tn)


async def require_namespace(ctx: Context, namespace: str) -> None:
    if not await ctx.run_blocking(ctx.resources.namespaces.exists, namespace):
        raise NotFound(f"namespace {namespace} does not exist")


async def topic_kind(ctx: Context, topic: str) -> int | None:
    """Partitions of ``topic`` when it is a partitioned topic, 0 for a non-partitioned one;
    ``TopicNotFound`` when it is neither."""
    partitions = await ctx.run_blocking(ctx.storage.partitions, topic)
    if partitions is not None:
        return partitions
    if await ctx.run_blocking(ctx.topic_metadata.topic_exists, topic):
        return 0
    raise TopicNotFound(f"topic {topic} does not exist")


def partition_names(topic: str, n: int) -> list[str]:
    tn = TopicName.parse(topic)
    return [str(tn.partition(i)) for i in range(n)]
