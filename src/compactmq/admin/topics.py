"""Topic paths: ``/admin/v2/{persistent|non-persistent}/{tenant}/{namespace}/{topic}[/...]``.

Partitioned topics are a name in the metadata store plus ordinary topics ``<name>-partition-<i>``
(created with it, so they are listed and can be compacted at once). Stats and policies of a
partitioned topic fan out to its partitions. Compaction of a partitioned topic is one run of
all its partitions (one Spark job by default, ``CompactionServiceFactory.compact_together``),
each partition keeping its own view and commit; its status is the partitions' aggregated
(``aggregate_compaction_status``), per partition with ``?perPartition=true``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..broker.dedup import DEDUP_CURSOR
from ..auth.policy_values import Target, check_partitions, check_policy_values
from ..errors import (
    AlreadyExists,
    CompactMQError,
    Conflict,
    InvalidInput,
    NotAllowed,
    NotFound,
    TopicNotFound,
)
from ..naming import TopicName
from ..compaction.state import ERROR, NOT_RUN, RUNNING, SUCCESS
from ..compaction.tiered import local_copy_deleted
from ..storage import COMPACTION_MAX_LAG, COMPACTION_THRESHOLD
from .access import LOOKUP, NAMESPACE_LOOKUP
from . import nonpersistent
from .common import Context, PreconditionFailed, query_flag, read_json
from .policies import POLICIES, Policy, applied_values
from .router import Router

TOPIC = "/admin/v2/{domain}/{tenant}/{namespace}/{topic}"
NAMESPACE = "/admin/v2/{domain}/{tenant}/{namespace}"


def add_routes(router: Router) -> None:
    router.add(
        "GET",
        NAMESPACE,
        list_topics,
        "list the topics of a namespace (partitions included)",
        requires=NAMESPACE_LOOKUP,
    )
    router.add(
        "GET",
        NAMESPACE + "/partitioned",
        list_partitioned_topics,
        "list the partitioned topics of a namespace",
        requires=NAMESPACE_LOOKUP,
    )
    router.add("PUT", TOPIC, create_topic, "create a non-partitioned topic", ok=204)
    router.add("DELETE", TOPIC, delete_topic, "delete a topic (?force=true closes its clients)", ok=204)
    router.add(
        "PUT",
        TOPIC + "/partitions",
        create_partitioned_topic,
        "create a partitioned topic",
        body="integer",
        ok=204,
    )
    router.add(
        "POST",
        TOPIC + "/partitions",
        update_partitioned_topic,
        "add partitions to a partitioned topic",
        body="integer",
        ok=204,
    )
    router.add(
        "GET",
        TOPIC + "/partitions",
        get_partitioned_metadata,
        "number of partitions of a topic",
        requires=LOOKUP,
    )  # the HTTP half of a client's lookup: what a lookup needs
    router.add(
        "DELETE",
        TOPIC + "/partitions",
        delete_partitioned_topic,
        "delete a partitioned topic and its partitions",
        ok=204,
    )
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
        TOPIC + "/internalStats",
        internal_stats,
        "ledgers, cursors, compacted ledger and compaction horizon",
        requires=LOOKUP,
    )
    router.add(
        "PUT",
        TOPIC + "/compaction",
        trigger_compaction,
        "trigger compaction (409 while one runs; a partitioned topic: all partitions in one job)",
        ok=204,
    )
    router.add(
        "GET",
        TOPIC + "/compaction",
        compaction_status,
        "status of the last compaction, with live progress while it runs (a partitioned topic: "
        "aggregated, each partition's with ?perPartition=true)",
    )
    for policy in POLICIES:
        _add_policy_routes(router, policy)


def topic_name(domain: str, tenant: str, namespace: str, topic: str) -> TopicName:
    return TopicName.parse(f"{domain}://{tenant}/{namespace}/{topic}")


def _persistent(tn: TopicName) -> str:
    if not tn.persistent:
        raise NotAllowed(f"{tn}: non-persistent topics are not supported by compactmq")
    return str(tn)


async def _require_namespace(ctx: Context, namespace: str) -> None:
    if not await ctx.run_blocking(ctx.resources.namespaces.exists, namespace):
        raise NotFound(f"namespace {namespace} does not exist")


async def _kind(ctx: Context, topic: str) -> int | None:
    """Partitions of ``topic`` when it is a partitioned topic, 0 for a non-partitioned one;
    ``TopicNotFound`` when it is neither."""
    partitions = await ctx.run_blocking(ctx.storage.partitions, topic)
    if partitions is not None:
        return partitions
    if await ctx.run_blocking(ctx.topic_metadata.topic_exists, topic):
        return 0
    raise TopicNotFound(f"topic {topic} does not exist")


def _partition_names(topic: str, n: int) -> list[str]:
    tn = TopicName.parse(topic)
    return [str(tn.partition(i)) for i in range(n)]


# --- listing, creating, deleting ----------------------------------------------------------------


async def list_topics(ctx: Context, request: web.Request, domain: str, tenant: str, namespace: str) -> Any:
    ns = f"{tenant}/{namespace}"
    await _require_namespace(ctx, ns)
    if domain == "non-persistent":
        return nonpersistent.names(ctx, ns)
    names = await ctx.run_blocking(ctx.topic_metadata.topics, ns)
    return [n for n in names if n.startswith(f"{domain}://")]


async def list_partitioned_topics(
    ctx: Context, request: web.Request, domain: str, tenant: str, namespace: str
) -> Any:
    ns = f"{tenant}/{namespace}"
    await _require_namespace(ctx, ns)
    names = await ctx.run_blocking(ctx.storage.partitioned_topics, ns)
    return [n for n in names if n.startswith(f"{domain}://")]


async def create_topic(ctx: Context, request: web.Request, **path: str) -> Any:
    topic = _persistent(topic_name(**path))
    tn = TopicName.parse(topic)
    await _require_namespace(ctx, tn.namespace_name)
    if await ctx.run_blocking(ctx.storage.partitions, topic) is not None:
        raise AlreadyExists(f"{topic} already exists as a partitioned topic")
    if await ctx.run_blocking(ctx.topic_metadata.topic_exists, topic):
        raise AlreadyExists(f"topic {topic} already exists")
    await ctx.run_blocking(ctx.storage.open_managed_ledger, topic, True)
    return None


async def _delete_one(ctx: Context, topic: str, force: bool) -> None:
    monitor = ctx.monitor
    if monitor is not None and monitor.is_running(topic):
        raise Conflict(f"a compaction of {topic} is running; delete it when the compaction ends")
    loaded = ctx.service.topics.loaded.get(topic)
    if loaded is not None and not force:
        producers = [p for p in loaded.producers.values() if not p.closed]
        consumers = [c for s in loaded.subscriptions.values() for c in s.consumers if not c.closed]
        if producers or consumers:
            raise PreconditionFailed(
                f"topic {topic} has {len(producers)} producer(s) and {len(consumers)} consumer(s) attached; "
                "use force=true to disconnect them"
            )
    await ctx.service.topics.unload(topic)
    await ctx.run_blocking(ctx.storage.delete_managed_ledger, topic)
    if monitor is not None:
        monitor.stats.pop(topic, None)
        monitor.forget(topic)
    ctx.sampler.forget(topic)


async def delete_topic(ctx: Context, request: web.Request, **path: str) -> Any:
    topic = _persistent(topic_name(**path))
    if await _kind(ctx, topic):
        raise Conflict(f"{topic} is a partitioned topic: delete it with DELETE .../partitions")
    await _delete_one(ctx, topic, query_flag(request, "force"))
    await ctx.run_blocking(ctx.service.schemas.topic_deleted, topic)
    return None


def _partitions_body(body: Any) -> int:
    if isinstance(body, bool) or not isinstance(body, int):
        raise InvalidInput(f"the body must be the number of partitions (a JSON integer), not {body!r:.80}")
    if body < 1:
        raise PreconditionFailed(f"the number of partitions must be at least 1, not {body}")
    return body


async def create_partitioned_topic(ctx: Context, request: web.Request, **path: str) -> Any:
    topic = _persistent(topic_name(**path))
    tn = TopicName.parse(topic)
    if tn.partition_index >= 0:
        raise PreconditionFailed(f"{topic} is a partition name; a partitioned topic cannot have it")
    n = check_partitions(
        _partitions_body(await read_json(request, "the number of partitions")), ctx.service.config
    )
    await _require_namespace(ctx, tn.namespace_name)
    if await ctx.run_blocking(ctx.topic_metadata.topic_exists, topic):
        raise AlreadyExists(f"a non-partitioned topic {topic} already exists")
    await ctx.run_blocking(ctx.storage.create_partitioned_topic, topic, n)
    await ctx.run_blocking(_create_partitions, ctx, topic, 0, n)
    return None


def _create_partitions(ctx: Context, topic: str, first: int, n: int) -> None:
    """Partitions ``first..n-1`` as topics, with the policies set on the partitioned topic."""
    policies = ctx.policies.get_topic_policies(topic)
    for name in _partition_names(topic, n)[first:]:
        ctx.topic_metadata.create_topic(name)
        if policies:
            ctx.policies.set_policies("topic", name, policies)


async def update_partitioned_topic(ctx: Context, request: web.Request, **path: str) -> Any:
    topic = _persistent(topic_name(**path))
    n = check_partitions(
        _partitions_body(await read_json(request, "the number of partitions")), ctx.service.config
    )
    old = await ctx.run_blocking(ctx.storage.partitions, topic)
    if old is None:
        raise TopicNotFound(f"partitioned topic {topic} does not exist")
    if n < old:
        raise PreconditionFailed(f"partitions can only be added: {topic} has {old}, asked for {n}")
    await ctx.run_blocking(ctx.storage.update_partitioned_topic, topic, n)
    await ctx.run_blocking(_create_partitions, ctx, topic, old, n)
    return None


async def get_partitioned_metadata(ctx: Context, request: web.Request, **path: str) -> Any:
    if query_flag(request, "checkAllowAutoCreation"):
        # the official client's HTTP lookup asks this first: answered as PARTITIONED_METADATA is
        # on the wire (namespace checked, partitioned auto-creation applied, 0 for a new topic)
        return {"partitions": await ctx.service.topics.partitions(str(topic_name(**path)), auto_create=True)}
    topic = _persistent(topic_name(**path))
    if query_flag(request, "checkAllowAutoCreation") and ctx.service.config["allowAutoTopicCreation"]:
        # a client's lookup over HTTP (http:// service URL): a topic it may auto-create is answered
        # as the binary PARTITIONED_METADATA answers it (0, or a new partitioned topic by type)
        return {"partitions": await ctx.service.topics.partitions(topic, auto_create=True)}
    n = await ctx.run_blocking(ctx.storage.partitions, topic)
    if n is None and not await ctx.run_blocking(ctx.topic_metadata.topic_exists, topic):
        raise TopicNotFound(f"topic {topic} does not exist")
    return {"partitions": n or 0}


async def delete_partitioned_topic(ctx: Context, request: web.Request, **path: str) -> Any:
    topic = _persistent(topic_name(**path))
    n = await ctx.run_blocking(ctx.storage.partitions, topic)
    if n is None:
        raise TopicNotFound(f"partitioned topic {topic} does not exist")
    force = query_flag(request, "force")
    for name in _partition_names(topic, n):
        if await ctx.run_blocking(ctx.topic_metadata.topic_exists, name):
            await _delete_one(ctx, name, force)
    await ctx.run_blocking(ctx.storage.delete_partitioned_topic, topic)
    await ctx.run_blocking(ctx.service.schemas.topic_deleted, topic)
    return None


# --- stats ----------------------------------------------------------------------------------------


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
        "lastCompactionRun": ctx.monitor.last_run(topic) if ctx.monitor is not None else None,
    }


def _stats_blocking(ctx: Context, topic: str, loaded: Any) -> dict[str, Any]:
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
            cursor = getattr(sub, "cursor", None)
        consumers = []
        if sub is not None:
            for c in list(sub.consumers):
                consumers.append(
                    {
                        "consumerName": c.name,
                        "msgOutCounter": c.messages_out,
                        "availablePermits": getattr(c.permits, "available", 0),
                        "readCompacted": bool(getattr(c, "read_compacted", False)),
                        "address": _address(c.connection),
                        # counted on Shared and Key_Shared subscriptions (see broker/limits.py)
                        "unackedMessages": getattr(c, "unacked_messages", 0),
                        "blockedConsumerOnUnackedMsgs": bool(getattr(c, "blocked_on_unacked", False)),
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


def _access_mode(p) -> str:
    from ..broker.producers import ACCESS_MODE_NAMES

    return ACCESS_MODE_NAMES.get(getattr(p, "access_mode", 0), "Shared")


def _sub_type(sub) -> str | None:
    if sub is None or getattr(sub, "sub_type", None) is None:
        return None
    from ..broker.subscriptions import SUB_TYPE_NAMES

    return SUB_TYPE_NAMES.get(sub.sub_type)


def _address(conn) -> str | None:
    peer = getattr(conn, "peer", None) or getattr(conn, "remote_address", None)
    return str(peer) if peer else None


def _unacked_stats(sub: Any) -> dict[str, Any]:
    """A subscription's unacknowledged messages and whether they stopped its dispatcher."""
    pending = getattr(getattr(sub, "dispatcher", None), "pending", None)
    return {
        "unackedMessages": getattr(pending, "total", 0),
        "blockedSubscriptionOnUnackedMsgs": bool(getattr(pending, "blocked", False)),
    }


async def topic_stats(ctx: Context, request: web.Request, **path: str) -> Any:
    tn = topic_name(**path)
    if not tn.persistent:
        return nonpersistent.topic_stats(ctx, str(tn))
    topic = _persistent(tn)
    if await _kind(ctx, topic):
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


async def partitioned_stats(ctx: Context, request: web.Request, **path: str) -> Any:
    topic = _persistent(topic_name(**path))
    n = await ctx.run_blocking(ctx.storage.partitions, topic)
    if n is None:
        raise TopicNotFound(f"partitioned topic {topic} does not exist")
    ctx.sampler.refresh()
    per: dict[str, Any] = {}
    for name in _partition_names(topic, n):
        try:
            per[name] = await ctx.run_blocking(
                _stats_blocking, ctx, name, ctx.service.topics.loaded.get(name)
            )
        except TopicNotFound:
            continue
    body: dict[str, Any] = {k: sum(s[k] for s in per.values()) for k in _SUMMED}
    body["metadata"] = {"partitions": n}
    body["publishers"] = [p for s in per.values() for p in s["publishers"]]
    body["compaction"] = {
        "lastCompactionRemovedEventCount": sum(
            s["compaction"]["lastCompactionRemovedEventCount"] for s in per.values()
        ),
        "lastCompactionSucceedTimestamp": max(
            (s["compaction"]["lastCompactionSucceedTimestamp"] for s in per.values()), default=0
        ),
        "lastCompactionFailedTimestamp": max(
            (s["compaction"]["lastCompactionFailedTimestamp"] for s in per.values()), default=0
        ),
        "lastCompactionDurationTimeInMills": max(
            (s["compaction"]["lastCompactionDurationTimeInMills"] for s in per.values()), default=0
        ),
        # ours: the partitions' views together, and the oldest uncompacted message of any
        "compactedKeys": (
            -1
            if any(s["compaction"]["compactedKeys"] < 0 for s in per.values())
            else sum(s["compaction"]["compactedKeys"] for s in per.values())
        ),
        "compactedTombstones": (
            -1
            if any(s["compaction"]["compactedTombstones"] < 0 for s in per.values())
            else sum(s["compaction"]["compactedTombstones"] for s in per.values())
        ),
        "compactedEntries": sum(s["compaction"]["compactedEntries"] for s in per.values()),
        "compactedSize": sum(s["compaction"]["compactedSize"] for s in per.values()),
        "compactionLagInMillis": max(
            (s["compaction"]["compactionLagInMillis"] for s in per.values()), default=0
        ),
    }
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
    topic = _persistent(topic_name(**path))
    if await _kind(ctx, topic):
        raise NotFound(f"{topic} is a partitioned topic: ask one of its partitions")
    return await ctx.run_blocking(_internal_stats_blocking, ctx, topic)


# --- compaction -----------------------------------------------------------------------------------


def _monitor(ctx: Context):
    monitor = ctx.monitor
    if monitor is None:
        from ..errors import ServiceNotReady

        raise ServiceNotReady("compaction is not available in this broker")
    return monitor


async def _compaction_target(ctx: Context, domain: str, path: dict) -> tuple[str, Any, int]:
    """(topic, compaction monitor, partitions or 0) for a compaction request on ``path``."""
    tn = topic_name(domain, **path)
    if not tn.persistent:
        raise NotAllowed(
            f"{tn}: compaction applies only to persistent topics (a non-persistent topic stores nothing)"
        )
    topic = str(tn)
    monitor = _monitor(ctx)
    return topic, monitor, await _kind(ctx, topic)


async def trigger_compaction(ctx: Context, request: web.Request, domain: str, **path: str) -> Any:
    topic, monitor, n = await _compaction_target(ctx, domain, path)
    if not n:
        await monitor.trigger(topic)
        return None
    # every partition in ONE run (one Spark job); partitions already compacting are left out
    conflicts = await monitor.trigger_together(_partition_names(topic, n))
    if conflicts:
        raise Conflict(f"a compaction is already running on {', '.join(conflicts)}")
    return None


async def compaction_status(ctx: Context, request: web.Request, domain: str, **path: str) -> Any:
    topic, monitor, n = await _compaction_target(ctx, domain, path)
    if not n:
        return await ctx.run_blocking(monitor.status_blocking, topic)
    per = {}
    for name in _partition_names(topic, n):
        per[name] = await ctx.run_blocking(monitor.status_blocking, name)
    body = aggregate_compaction_status(per)
    if query_flag(request, "perPartition"):
        body["partitions"] = per
    return body


def aggregate_compaction_status(per: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One ``LongRunningProcessStatus`` for a partitioned topic from its partitions' statuses:
    RUNNING while any partition runs; else ERROR when any failed (``lastError`` lists each
    failed partition with its error); else SUCCESS when any succeeded (a partition that never
    had anything to compact does not hold the topic back); else NOT_RUN. While running, one
    progress for the whole topic: entries of all partitions, the phase they are in (they share
    one job), the longest ETA. ``partitionCounts``: partitions per status (ours)."""
    statuses = [s["status"] for s in per.values()]
    if RUNNING in statuses:
        status = RUNNING
    elif ERROR in statuses:
        status = ERROR
    elif SUCCESS in statuses:
        status = SUCCESS
    else:
        status = NOT_RUN
    errors = [
        f"{name}: {s['lastError']}" for name, s in per.items() if s["status"] == ERROR and s["lastError"]
    ]
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    body: dict[str, Any] = {"status": status, "lastError": "; ".join(errors), "partitionCounts": counts}
    running = [s["progress"] for s in per.values() if s.get("progress")]
    if status == RUNNING and running:
        etas = [p["etaSeconds"] for p in running if p.get("etaSeconds") is not None]
        phases = sorted({p["phase"] for p in running})
        body["progress"] = {
            "phase": phases[0] if len(phases) == 1 else "/".join(phases),
            "entriesProcessed": sum(p["entriesProcessed"] for p in running),
            "entriesTotal": sum(p["entriesTotal"] for p in running),
            "etaSeconds": max(etas) if etas else None,
        }
    return body


# --- policies -------------------------------------------------------------------------------------


def _add_policy_routes(router: Router, policy: Policy) -> None:
    async def get_policy(ctx: Context, request: web.Request, **path: str) -> Any:
        topic = _persistent(topic_name(**path))
        await _kind(ctx, topic)
        own = await ctx.run_blocking(ctx.policies.get_topic_policies, topic)
        if query_flag(request, "applied"):
            ns = await ctx.run_blocking(
                ctx.policies.get_namespace_policies, TopicName.parse(topic).namespace_name
            )
            return policy.render(applied_values(policy, own, ns, ctx.service.config))
        return policy.render(own)

    async def set_policy(ctx: Context, request: web.Request, **path: str) -> Any:
        topic = _persistent(topic_name(**path))
        n = await _kind(ctx, topic)
        values = policy.parse(await read_json(request, policy.summary))
        # every value through its rule (auth.policy_values), off the event loop (realpath)
        where = Target(ctx.service.config, TopicName.parse(topic).namespace_name, topic)
        values = await ctx.run_blocking(check_policy_values, values, where)
        targets = [topic] + _partition_names(topic, n or 0)
        await ctx.run_blocking(_set_topic_policies, ctx, targets, values)
        await ctx.service.topics.policies_changed(topic)
        return None

    async def remove_policy(ctx: Context, request: web.Request, **path: str) -> Any:
        topic = _persistent(topic_name(**path))
        n = await _kind(ctx, topic)
        targets = [topic] + _partition_names(topic, n or 0)
        await ctx.run_blocking(_set_topic_policies, ctx, targets, {k: None for k in policy.keys})
        await ctx.service.topics.policies_changed(topic)
        return None

    for fn, verb in ((get_policy, "get"), (set_policy, "set"), (remove_policy, "remove")):
        fn.__name__ = f"{verb}_topic_{policy.path}"
    pattern = f"{TOPIC}/{policy.path}"
    router.add(
        "GET", pattern, get_policy, f"topic policy: {policy.summary} (?applied=true: the value in force)"
    )
    router.add(
        "POST", pattern, set_policy, f"set the topic policy: {policy.summary}", body=policy.body_type, ok=204
    )
    router.add(
        "PUT", pattern, set_policy, f"set the topic policy: {policy.summary}", body=policy.body_type, ok=204
    )
    router.add("DELETE", pattern, remove_policy, f"remove the topic policy: {policy.summary}", ok=204)


def _set_topic_policies(ctx: Context, topics: list[str], values: dict[str, Any]) -> None:
    ctx.policies.set_topic_policies(topics, values)  # one commit: the topic and its partitions
    if (values.get(COMPACTION_THRESHOLD) or 0) > 0 or (values.get(COMPACTION_MAX_LAG) or 0) > 0:
        ensure_compaction_cursors(ctx, [t for t in topics if ctx.topic_metadata.topic_exists(t)])


def ensure_compaction_cursors(ctx: Context, topics: list[str]) -> None:
    """A threshold was set: create the ``__compaction`` cursor (at the earliest position) of each
    topic, so retention keeps their entries until a compaction has read them."""
    from ..broker.compaction_monitor import ensure_compaction_cursor

    for topic in topics:
        try:
            ensure_compaction_cursor(ctx.storage.open_managed_ledger(topic, create=False))
        except CompactMQError:
            continue
