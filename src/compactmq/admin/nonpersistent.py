"""Admin views of non-persistent topics: the ones in use, and their stats.

A non-persistent topic has no ledger and no cursor; it is listed while it has producers or
subscriptions, and its stats are Pulsar's NonPersistentTopicStats shape: rates and counters in
and out, and ``msgDropRate`` (messages per second, over the last minute, that a consumer could
not take because its receiver queue was full) for the topic, each subscription and consumer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..errors import NotFound
from .common import Context

if TYPE_CHECKING:
    from ..broker.nonpersistent import NonPersistentSubscription


_SUB_TYPES: dict[int | None, str] = {0: "Exclusive", 1: "Shared", 2: "Failover", 3: "Key_Shared"}


def names(ctx: Context, namespace: str) -> list[str]:
    return ctx.service.topics.non_persistent.names(namespace)


def topic_stats(ctx: Context, topic: str) -> dict[str, Any]:
    t = ctx.service.topics.non_persistent.active.get(topic)
    if t is None or t.closed:
        raise NotFound(
            f"topic {topic} is not in use (a non-persistent topic exists while it has "
            "producers or subscriptions)"
        )
    live = [p for p in list(t.producers.values()) if not p.closed]
    publishers = [
        {
            "producerName": p.name,
            "producerId": p.producer_id,
            "msgInCounter": p.messages_in,
            "bytesInCounter": p.bytes_in,
            "msgDropRate": 0.0,
        }
        for p in live
    ]
    subscriptions: dict[str, Any] = {}
    for name, stored in sorted(t.subscriptions.items()):
        sub = cast("NonPersistentSubscription", stored)  # what a non-persistent topic holds
        consumers = [
            {
                "consumerName": c.name,
                "msgOutCounter": c.messages_out,
                "availablePermits": max(0, c.permits.available),
                # a consumer gets its drop meter at its first drop (broker.nonpersistent.dropped)
                "msgDropRate": c.drops.rate if getattr(c, "drops", None) is not None else 0.0,  # type: ignore[attr-defined]
            }
            for c in list(sub.consumers)
        ]
        subscriptions[name] = {
            "type": _SUB_TYPES.get(sub.sub_type),
            "isDurable": False,
            "msgRateOut": sub.sent.rate,
            "msgOutCounter": sub.sent.total,
            "msgDropRate": sub.drops.rate,
            "consumers": consumers,
        }
    msg_in = sum(p.messages_in for p in live) + t.closed_producers_in[0]
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
