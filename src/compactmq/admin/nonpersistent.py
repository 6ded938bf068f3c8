"""Admin views of non-persistent topics: the ones in use, and their stats.

A non-persistent topic has no ledger and no cursor; it is listed while it has producers or
subscriptions, and its stats are Pulsar's NonPersistentTopicStats shape: rates and counters in
and out, and ``msgDropRate`` (messages per second, over the last minute, that a consumer could
not take because its receiver queue was full) for the topic, each subscription and consumer.
"""

from __future__ import annotations

from typing import Any

from ..errors import NotFound
from .common import Context


def names(ctx: Context, namespace: str) -> list[str]:
    return ctx.service.topics.non_persistent.names(namespace)


def topic_stats(ctx: Context, topic: str) -> dict[str, Any]:
    t = ctx.service.topics.non_persistent.active.get(topic)
    if t is None or t.closed:
        raise NotFound(
            f"topic {topic} is not in use (a non-persistent topic exists while it has "
            "producers or subscriptions)"
        )
    publishers = [
        {
            "producerName": p.name,
            "producerId": p.producer_id,
            "msgInCounter": p.messages_in,
            "bytesInCounter": p.bytes_in,
            "msgDropRate": 0.0,
        }
        for p in list(t.producers.values())
        if not p.closed
    ]
    subscriptions: dict[str, Any] = {}
    for name, sub in sorted(t.subscriptions.items()):
        consumers = [
            {
                "consumerName": c.name,
                "msgOutCounter": c.messages_out,
                "availablePermits": max(0, c.permits.available),
                "msgDropRate": c.drops.rate if getattr(c, "drops", None) is not None else 0.0,
            }
            for c in list(sub.consumers)
        ]
        subscriptions[name] = {
            "type": {0: "Exclusive", 1: "Shared", 2: "Failover", 3: "Key_Shared"}.get(sub.sub_type),
            "isDurable": False,
            "msgRateOut": sub.sent.rate,
            "msgOutCounter": sub.sent.total,
            "msgDropRate": sub.drops.rate,
            "consumers": consumers,
        }
    msg_in = sum(p["msgInCounter"] for p in publishers) + t.closed_producers_in[0]
    return {
        "msgRateIn": t.received.rate,
        "msgThroughputIn": t.received_bytes.rate,
        "msgRateOut": sum(s["msgRateOut"] for s in subscriptions.values()),
        "msgInCounter": msg_in,
        "bytesInCounter": t.received_bytes.total,
        "msgOutCounter": sum(s["msgOutCounter"] for s in subscriptions.values()),
        "msgDropRate": t.drops.rate,
        "storageSize": 0,
        "backlogSize": 0,
        "publishers": publishers,
        "subscriptions": subscriptions,
    }
