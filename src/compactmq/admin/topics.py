"""Topic paths: ``/admin/v2/{persistent|non-persistent}/{tenant}/{namespace}/{topic}[/...]``.

Partitioned topics are a name in the metadata store plus ordinary topics ``<name>-partition-<i>``
(created with it, so they are listed and can be compacted at once). Policies of a partitioned
topic fan out to its partitions (stats, which do too, are in ``topic_stats``). Compaction of a
partitioned topic is one run of all its partitions (one Spark job by default,
``CompactionServiceFactory.compact_together``), each partition keeping its own view and commit;
its status is the partitions' aggregated (``aggregate_compaction_status``), per partition with
``?perPartition=true``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..auth.policy_rules import Target, check_partitions, check_policy_values
from ..errors import (
    AlreadyExists,
    CompactMQError,
    Conflict,
    InvalidInput,
    NotAllowed,
    TopicNotFound,
)
from ..naming import TopicName
from ..compaction.state import ERROR, NOT_RUN, RUNNING, SUCCESS
from ..storage import COMPACTION_MAX_LAG, COMPACTION_THRESHOLD
from .access import LOOKUP, NAMESPACE_LOOKUP
from . import nonpersistent
from .common import Context, PreconditionFailed, query_flag, read_json
from .policies import POLICIES, Policy, applied_values
from .router import Router
from .topic_lookup import NAMESPACE, TOPIC, topic_name
from .topic_lookup import partition_names as _partition_names
from .topic_lookup import persistent_name as _persistent
from .topic_lookup import require_namespace as _require_namespace
from .topic_lookup import topic_kind as _kind
from . import topic_stats


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
    topic_stats.add_routes(router)
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
    if monitor.is_running(topic):
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


# --- compaction -----------------------------------------------------------------------------------


async def _compaction_target(ctx: Context, domain: str, path: dict) -> tuple[str, Any, int | None]:
    """(topic, compaction monitor, ``topic_kind``: partitions, 0 or None) for a compaction request on ``path``."""
    tn = topic_name(domain, **path)
    if not tn.persistent:
        raise NotAllowed(
            f"{tn}: compaction applies only to persistent topics (a non-persistent topic stores nothing)"
        )
    topic = str(tn)
    monitor = ctx.monitor
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
        # every value through its rule (auth.policy_rules), off the event loop (realpath)
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
