"""A topic's stats: ``GET .../stats``, ``.../partitioned-stats`` and ``.../internalStats``.

``partitioned-internalStats`` gives each partition's ``internalStats``. In a cluster, the
partitioned forms ask each partition's owner (``partition_owners``).

``stats`` is Pulsar's TopicStats (rates and counters from the traffic sampler, publishers,
subscriptions with their consumers and backlog) with a ``compaction`` object: Pulsar's four
``lastCompaction*`` fields, then ours about the compacted view in force. ``partitioned-stats``
sums the partitions' stats (``_SUMMED``) and keeps each partition's with ``?perPartition``.
``internalStats`` is the managed ledger's own view: ledgers (and where offloaded ones went),
cursors, the compacted ledger and the compaction horizon. Reading the store is blocking, so each
is computed in ``ctx.run_blocking``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..broker.dedup import DEDUP_CURSOR
from ..compaction.tiered import local_copy_deleted
from ..errors import NotFound, TopicNotFound
from . import nonpersistent, partition_owners
from .access import LOOKUP
from .common import Context, query_flag
from .router import Router
from .topic_lookup import TOPIC, partition_names, persistent_name, topic_kind, topic_name

if TYPE_CHECKING:
    from ..broker.connection import ServerConnection
    from ..broker.producers import Producer
    from ..broker.subscriptions import Subscription
    from ..broker.topics import Topic


def add_routes(router: Router) -> None:
    # Pulsar's GET_STATS topic operation: any role that may look the topic up (produce or
    # consume) reads its stats and internal stats, as a tenant admin does
    router.add("GET", TOPIC + "/stats", topic_stats, "topic stats, with a compaction object", requires=LOOKUP)
    router.add(
        "GET",
        TOPIC + "/partitioned-stats",
        partitioned_stats,
        "stats of a partitioned topic and its partitions",
        requires=LOOKUP,
    )
    router.add(
        "GET",
        TOPIC + "/partitioned-internalStats",
        partitioned_internal_stats,
        "internal stats of each partition of a partitioned topic",
        requires=LOOKUP,
    )
    router.add(
        "GET",
        TOPIC + "/internalStats",
        internal_stats,
        "ledgers, cursors, compacted ledger and compaction horizon",
        requires=LOOKUP,
    )


def _compaction_stats(ctx: Context, topic: str, ml: Any, state: Any) -> dict[str, Any]:
    """Pulsar's ``CompactionStats`` (the four ``lastCompaction*`` fields), then ours: keys, entries
    and bytes of the compacted view in force (``compactedKeys``: live keys only; the tombstones
    that ``compactionTombstoneRetentionSeconds`` keeps in the view are ``compactedTombstones``;
    -1: the service does not count them), the
    compaction lag (age of the oldest uncompacted message, 0 when all is compacted) and the
    wall time of each phase of the last run that committed it, and the job that ran it."""
    view = ctx.compaction_stats(topic)
    has_view = view.view_id is not None
    return {
        "lastCompactionRemovedEventCount": state.removed_event_count,
        "lastCompactionSucceedTimestamp": state.last_success_ms or 0,
        "lastCompactionFailedTimestamp": state.last_failure_ms or 0,
        "lastCompactionDurationTimeInMills": state.last_duration_ms or 0,
        "compactedKeys": view.keys if has_view else 0,
        "compactedTombstones": view.tombstones if has_view else 0,
        "compactedEntries": view.entries if has_view else 0,
        "compactedSize": max(0, view.size_bytes) if has_view else 0,
        "compactionLagInMillis": ctx.compaction_lag_ms(ml, state.horizon),
        "lastCompactionPhaseTimesInMillis": {
            k: int(round(float(v) * 1000)) for k, v in (view.last_run_steps or {}).items()
        },
        # the job that ran the last run (Spark job group): the partitions of a partitioned
        # topic compacted together share one
        "lastCompactionJob": view.last_run_job,
        # the last run in this broker: reason, outcome, the topics that shared its job, its job
        # group, milliseconds per phase (the monitor's queue / begin / after around the run's
        # steps) and of the engine's split of its step (driver, jobs, other)
        "lastCompactionRun": ctx.monitor.last_run(topic),
        # with a maximum lag: the policy, the least lag the monitor could keep at its last check
        # of the topic, and whether the policy is kept (broker.compaction_lagbound)
        "maxLag": ctx.monitor.max_lag_status(topic),
    }


def _stats_blocking(ctx: Context, topic: str, loaded: Topic | None) -> dict[str, Any]:
    ml = ctx.storage.open_managed_ledger(topic, create=False)
    traffic = ctx.sampler.topic(topic)
    state = ctx.compaction_state(topic)
    publishers = []
    subscriptions: dict[str, Any] = {}
    live_subs = dict(loaded.subscriptions) if loaded is not None else {}
    if loaded is not None:
        for p in list(loaded.producers.values()):
            if p.closed:
                continue
            publishers.append(
                {
                    "producerName": p.name,
                    "producerId": p.producer_id,
                    "accessMode": _access_mode(p),
                    "msgInCounter": p.messages_in,
                    "bytesInCounter": p.bytes_in,
                    "msgRateIn": traffic.producer_rate(p.serial),
                    "address": _address(p.connection),
                }
            )
    names = {c.name for c in ml.cursors() if c.name != DEDUP_CURSOR} | set(live_subs)
    for name in sorted(names):
        cursor = ml.get_cursor(name)
        sub = live_subs.get(name)
        if cursor is None and sub is not None:
            cursor = sub.cursor
        consumers = []
        if sub is not None:
            for c in list(sub.consumers):
                consumers.append(
                    {
                        "consumerName": c.name,
                        "msgOutCounter": c.messages_out,
                        "availablePermits": c.permits.available,
                        "readCompacted": bool(c.read_compacted),
                        "address": _address(c.connection),
                        # counted on Shared and Key_Shared subscriptions (see broker/limits.py)
                        "unackedMessages": c.unacked_messages,
                        "blockedConsumerOnUnackedMsgs": c.blocked_on_unacked,
                    }
                )
        backlog = cursor.backlog() if cursor is not None else 0
        subscriptions[name] = {
            "type": _sub_type(sub),
            "isDurable": sub.durable if sub is not None else True,
            "msgBacklog": backlog,
            "consumers": consumers,
            "markDeletePosition": str(cursor.mark_delete_position) if cursor is not None else None,
            "msgOutCounter": sum(c["msgOutCounter"] for c in consumers),
            **_unacked_stats(sub),
        }
    size = ml.total_size()
    entries = ml.entry_count()
    horizon = state.horizon
    return {
        "msgRateIn": traffic.rate_in,
        "msgThroughputIn": traffic.throughput_in,
        "msgRateOut": traffic.rate_out,
        "msgThroughputOut": traffic.throughput_out,
        "msgInCounter": traffic.msg_in,
        "bytesInCounter": traffic.bytes_in,
        "msgOutCounter": traffic.msg_out,
        "bytesOutCounter": traffic.bytes_out,
        "averageMsgSize": (traffic.bytes_in / traffic.msg_in) if traffic.msg_in else 0.0,
        "storageSize": size,
        "entriesCount": entries,
        "backlogSize": max((ml.size_after(c.mark_delete_position) for c in ml.cursors()), default=0),
        "publishers": publishers,
        "subscriptions": subscriptions,
        "waitingPublishers": loaded.waiting_producers if loaded is not None else 0,
        "compaction": _compaction_stats(ctx, topic, ml, state),
        "compactionHorizon": str(horizon) if horizon is not None else None,
        "topicEpoch": loaded.epoch if loaded is not None and loaded.epoch >= 0 else None,
        # ours: the key indexes behind GET .../latest/{key}, once the topic has been asked
        "latestValue": ctx.service.latest_values.topic_stats(topic),
    }


def _access_mode(p: Producer) -> str:
    from ..broker.producers import ACCESS_MODE_NAMES

    return ACCESS_MODE_NAMES.get(p.access_mode, "Shared")


def _sub_type(sub: Subscription | None) -> str | None:
    if sub is None or sub.sub_type is None:
        return None
    from ..broker.subscriptions import SUB_TYPE_NAMES

    return SUB_TYPE_NAMES.get(sub.sub_type)


def _address(conn: ServerConnection) -> str | None:
    """The client's address ("?" before the socket reported one, as the broker logs it)."""
    return str(conn.peer) if conn.peer else None


def _unacked_stats(sub: Subscription | None) -> dict[str, Any]:
    """A subscription's unacknowledged messages and whether they stopped its dispatcher."""
    pending = sub.dispatcher.pending if sub is not None and sub.dispatcher is not None else None
    return {
        "unackedMessages": pending.total if pending is not None else 0,
        "blockedSubscriptionOnUnackedMsgs": bool(pending.blocked) if pending is not None else False,
    }


async def topic_stats(ctx: Context, request: web.Request, **path: str) -> Any:
    tn = topic_name(**path)
    if not tn.persistent:
        return nonpersistent.topic_stats(ctx, str(tn))
    topic = persistent_name(tn)
    if await topic_kind(ctx, topic):
        raise NotFound(f"{topic} is a partitioned topic: use partitioned-stats")
    ctx.sampler.refresh()
    return await ctx.run_blocking(_stats_blocking, ctx, topic, ctx.service.topics.loaded.get(topic))


_SUMMED = (
    "msgRateIn",
    "msgThroughputIn",
    "msgRateOut",
    "msgThroughputOut",
    "msgInCounter",
    "bytesInCounter",
    "msgOutCounter",
    "bytesOutCounter",
    "storageSize",
    "entriesCount",
    "backlogSize",
    "waitingPublishers",
)


def _summed(per: dict[str, Any], n: int) -> dict[str, Any]:
    """The partitions' stats together. A field a partition's answer lacks (an owner of another
    version, in a cluster) counts as 0 rather than failing the whole call."""
    comp = [s.get("compaction") or {} for s in per.values()]

    def total(rows: list[dict[str, Any]], key: str) -> Any:
        return sum(r.get(key, 0) for r in rows)

    def latest(key: str) -> Any:
        return max((c.get(key, 0) for c in comp), default=0)

    def counted(key: str) -> Any:  # -1: some partition's service does not count them
        return -1 if any(c.get(key, 0) < 0 for c in comp) else total(comp, key)

    body: dict[str, Any] = {k: total(list(per.values()), k) for k in _SUMMED}
    body["metadata"] = {"partitions": n}
    body["publishers"] = [p for s in per.values() for p in s.get("publishers", [])]
    body["compaction"] = {
        "lastCompactionRemovedEventCount": total(comp, "lastCompactionRemovedEventCount"),
        "lastCompactionSucceedTimestamp": latest("lastCompactionSucceedTimestamp"),
        "lastCompactionFailedTimestamp": latest("lastCompactionFailedTimestamp"),
        "lastCompactionDurationTimeInMills": latest("lastCompactionDurationTimeInMills"),
        # ours: the partitions' views together, and the oldest uncompacted message of any
        "compactedKeys": counted("compactedKeys"),
        "compactedTombstones": counted("compactedTombstones"),
        "compactedEntries": total(comp, "compactedEntries"),
        "compactedSize": total(comp, "compactedSize"),
        "compactionLagInMillis": latest("compactionLagInMillis"),
    }
    return body


async def partitioned_stats(ctx: Context, request: web.Request, **path: str) -> Any:
    topic = persistent_name(topic_name(**path))
    n = await ctx.run_blocking(ctx.storage.partitions, topic)
    if n is None:
        raise TopicNotFound(f"partitioned topic {topic} does not exist")
    ctx.sampler.refresh()

    async def local(name: str) -> Any:
        return await ctx.run_blocking(_stats_blocking, ctx, name, ctx.service.topics.loaded.get(name))

    # in a cluster each partition's stats come from its owner (partition_owners)
    per = await partition_owners.gather(ctx, request, partition_names(topic, n), "/stats", local)
    body = _summed(per, n)
    if query_flag(request, "perPartition") or "perPartition" not in request.query:
        body["partitions"] = per
    return body


def _internal_stats_blocking(ctx: Context, topic: str) -> dict[str, Any]:
    ml = ctx.storage.open_managed_ledger(topic, create=False)
    state = ctx.compaction_state(topic)
    ledgers = ml.ledgers()
    offloaded = ml.offload_state()  # tiered storage: {ledger id: where, local copy deleted}
    last = ml.last_position()
    cursors = {}
    for c in ml.cursors():
        cursors[c.name] = {
            "markDeletePosition": str(c.mark_delete_position),
            "readPosition": str(c.read_position),
            "messagesBacklog": c.backlog(),
            # acknowledged ranges after the mark-delete position, both ends included
            "individuallyDeletedMessages": "["
            + ",".join(f"[{a}..{b}]" for a, b in c.individually_acked_ranges())
            + "]",
            "properties": c.properties,
            "state": "Open",
        }
    compacted = {"ledgerId": -1, "entries": -1, "size": -1, "offloaded": False, "underReplicated": False}
    view = ctx.compaction_stats(topic)
    if view.view_id is not None:
        # offloaded once sealed (tiered storage): where it lives, and whether the local file is gone
        rec = ctx.storage.offloader.compacted_record(view.view_id)
        compacted = {
            "ledgerId": view.view_id,
            "entries": view.entries,
            "size": view.size_bytes,
            "underReplicated": False,
            "offloaded": rec is not None,
        }
        if rec is not None:
            compacted.update(
                offloadLocation=rec.location.describe(),
                localCopyDeleted=local_copy_deleted(ctx.storage, topic, view.view_id),
            )
    current = ledgers[-1] if ledgers else None
    return {
        "entriesAddedCounter": ml.entry_count(),
        "numberOfEntries": ml.entry_count(),
        "totalSize": ml.total_size(),
        "currentLedgerEntries": current.entry_count if current else 0,
        "currentLedgerSize": current.size if current else 0,
        "lastLedgerCreatedTimestamp": current.created_ms if current else 0,
        "lastConfirmedEntry": str(last)
        if last is not None
        else (f"{current.ledger_id}:-1" if current else "-1:-1"),
        "state": "LedgerOpened",
        "ledgers": [
            {
                "ledgerId": li.ledger_id,
                "entries": li.entry_count,
                "size": li.size,
                "state": li.state,
                "offloaded": li.ledger_id in offloaded,
                "underReplicated": False,
                **(
                    {
                        "offloadLocation": offloaded[li.ledger_id]["location"],
                        "localCopyDeleted": offloaded[li.ledger_id]["localCopyDeleted"],
                    }
                    if li.ledger_id in offloaded
                    else {}
                ),
            }
            for li in ledgers
        ],
        "cursors": cursors,
        "compactedLedger": compacted,
        "compactionHorizon": str(state.horizon) if state.horizon is not None else None,
        "compactionStatus": state.status,
    }


async def internal_stats(ctx: Context, request: web.Request, **path: str) -> Any:
    topic = persistent_name(topic_name(**path))
    if await topic_kind(ctx, topic):
        raise NotFound(f"{topic} is a partitioned topic: ask one of its partitions")
    return await ctx.run_blocking(_internal_stats_blocking, ctx, topic)


async def partitioned_internal_stats(ctx: Context, request: web.Request, **path: str) -> Any:
    """Pulsar's ``PartitionedTopicInternalStats``: ``metadata`` and each partition's internal
    stats (from its owner, in a cluster)."""
    topic = persistent_name(topic_name(**path))
    n = await ctx.run_blocking(ctx.storage.partitions, topic)
    if n is None:
        raise TopicNotFound(f"partitioned topic {topic} does not exist")

    async def local(name: str) -> Any:
        return await ctx.run_blocking(_internal_stats_blocking, ctx, name)

    per = await partition_owners.gather(ctx, request, partition_names(topic, n), "/internalStats", local)
    return {"metadata": {"partitions": n}, "partitions": per}
