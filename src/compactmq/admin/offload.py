"""Tiered-storage admin paths, as Pulsar's: trigger and watch an offload, namespace policies.

* ``PUT  /admin/v2/persistent/{tenant}/{ns}/{topic}/offload`` with a message id body
  (``{"ledgerId": L, "entryId": E}``): offload, in the background, every sealed ledger before
  ledger L. 409 while an offload of the topic runs; 412 when no driver is configured.
* ``GET  .../offload``: Pulsar's ``OffloadProcessStatus``: ``status`` (NOT_RUN, RUNNING, SUCCESS,
  ERROR), ``lastError`` and ``firstUnoffloadedMessage`` (the first message still only local).
* namespace policies ``offloadThreshold`` (bytes kept locally; -1 never offload, 0 at once),
  ``offloadThresholdInSeconds``, ``offloadDeletionLagMs`` and ``offloadPolicies`` (an object with
  the broker.conf offload keys: driver, bucket, region, endpoint, fileSystemURI, thresholds), each
  GET / PUT|POST / DELETE; ``removeOffloadPolicies`` is Pulsar's other DELETE path.

Credentials are never accepted in a policy (they would be stored in the metadata store and shown
by GET): they come from the broker's environment, the standard ways.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ..errors import InvalidConfiguration, InvalidInput, NotFound
from ..storage.offload import (
    OFFLOAD_DELETION_LAG,
    OFFLOAD_POLICIES,
    OFFLOAD_THRESHOLD,
    OFFLOAD_THRESHOLD_SECONDS,
    location_from_settings,
)
from ..storage.position import Position
from .common import Context, PreconditionFailed, read_json
from .namespaces import NS, _add_policy_routes
from .policies import Policy, fallbacks
from .router import Router
from .topic_lookup import TOPIC, topic_name
from .topic_lookup import persistent_name as _persistent
from .topic_lookup import topic_kind as _kind

# fields of Pulsar's OffloadPolicies that compactmq honours, with their JSON types
POLICY_FIELDS: dict[str, type] = {
    "managedLedgerOffloadDriver": str,
    "managedLedgerOffloadThresholdInBytes": int,
    "managedLedgerOffloadThresholdInSeconds": int,
    "managedLedgerOffloadDeletionLagInMillis": int,
    "s3ManagedLedgerOffloadBucket": str,
    "s3ManagedLedgerOffloadRegion": str,
    "s3ManagedLedgerOffloadServiceEndpoint": str,
    "s3ManagedLedgerOffloadMaxBlockSizeInBytes": int,
    "s3ManagedLedgerOffloadReadBufferSizeInBytes": int,
    "gcsManagedLedgerOffloadBucket": str,
    "fileSystemURI": str,
}
# accepted for compatibility with Pulsar clients, not used
IGNORED_FIELDS = {
    "managedLedgerOffloadMaxThreads",
    "managedLedgerOffloadPrefetchRounds",
    "managedLedgerOffloadedReadPriority",
    "offloadersDirectory",
    "fileSystemProfilePath",
    "gcsManagedLedgerOffloadRegion",
    "gcsManagedLedgerOffloadMaxBlockSizeInBytes",
    "gcsManagedLedgerOffloadReadBufferSizeInBytes",
    "managedLedgerExtraConfigurations",
}
SECRET_FIELDS = {
    "s3ManagedLedgerOffloadCredentialId",
    "s3ManagedLedgerOffloadCredentialSecret",
    "s3ManagedLedgerOffloadRole",
    "s3ManagedLedgerOffloadRoleSessionName",
    "gcsManagedLedgerOffloadServiceAccountKeyFile",
}


def _long(name: str, minimum: int):
    def parse(body: Any) -> dict[str, Any]:
        if isinstance(body, str) and body.strip().lstrip("-").isdigit():
            body = int(body)
        if isinstance(body, bool) or not isinstance(body, int):
            raise InvalidInput(f"{name} must be a JSON integer, not {body!r}")
        if body < minimum:
            raise PreconditionFailed(f"{name} must be at least {minimum}, not {body}")
        return {name: body}

    return parse


def _offload_policies(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidInput("offloadPolicies must be a JSON object of offload settings")
    secrets = sorted(SECRET_FIELDS & set(body))
    if secrets:
        raise PreconditionFailed(
            f"offloadPolicies: {', '.join(secrets)} not accepted: credentials come from "
            "the broker's environment (AWS variables, profile files)"
        )
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key in IGNORED_FIELDS or value is None:
            continue
        kind = POLICY_FIELDS.get(key)
        if kind is None:
            raise PreconditionFailed(f"offloadPolicies: unknown field {key!r}")
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidInput(f"offloadPolicies: {key} must be an integer, not {value!r}")
        if kind is str and not isinstance(value, str):
            raise InvalidInput(f"offloadPolicies: {key} must be a string, not {value!r}")
        out[key] = value
    try:
        location_from_settings(out)
    except InvalidConfiguration as e:
        raise PreconditionFailed(f"offloadPolicies: {e}") from None
    return {OFFLOAD_POLICIES: out}


def _single(key: str):
    return lambda values: values.get(key)


def _render_policies(values: Mapping[str, Any]) -> Any:
    v = values.get(OFFLOAD_POLICIES)
    if isinstance(v, str):  # ?applied=true without a namespace policy: the broker's driver
        return {"managedLedgerOffloadDriver": v}
    return v


POLICIES = (
    Policy(
        "offloadThreshold",
        (OFFLOAD_THRESHOLD,),
        _long(OFFLOAD_THRESHOLD, -1),
        _single(OFFLOAD_THRESHOLD),
        fallbacks(OFFLOAD_THRESHOLD),
        "integer",
        "bytes a topic keeps locally before sealed ledgers are offloaded (-1: never, 0: at once)",
    ),
    Policy(
        "offloadThresholdInSeconds",
        (OFFLOAD_THRESHOLD_SECONDS,),
        _long(OFFLOAD_THRESHOLD_SECONDS, -1),
        _single(OFFLOAD_THRESHOLD_SECONDS),
        fallbacks(OFFLOAD_THRESHOLD_SECONDS),
        "integer",
        "offload sealed ledgers older than this many seconds (-1: never)",
    ),
    Policy(
        "offloadDeletionLagMs",
        (OFFLOAD_DELETION_LAG,),
        _long(OFFLOAD_DELETION_LAG, 0),
        _single(OFFLOAD_DELETION_LAG),
        fallbacks(OFFLOAD_DELETION_LAG),
        "integer",
        "delete the local copy of an offloaded ledger this many ms after the offload",
    ),
    Policy(
        "offloadPolicies",
        (OFFLOAD_POLICIES,),
        _offload_policies,
        _render_policies,
        fallbacks(OFFLOAD_POLICIES),
        "object",
        "offload settings of the namespace (driver, bucket, region, endpoint, fileSystemURI, thresholds)",
    ),
)


def add_routes(router: Router) -> None:
    router.add(
        "PUT",
        TOPIC + "/offload",
        trigger_offload,
        "offload every sealed ledger before the given message id (409 while one runs)",
        body="object",
        ok=204,
    )
    router.add("GET", TOPIC + "/offload", offload_status, "status of the last offload of the topic")
    for policy in POLICIES:
        _add_policy_routes(router, policy)

    async def remove_offload_policies(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
        name = f"{tenant}/{namespace}"
        if not await ctx.run_blocking(ctx.resources.namespaces.exists, name):
            raise NotFound(f"namespace {name} does not exist")
        await ctx.run_blocking(ctx.policies.set_policies, "namespace", name, {OFFLOAD_POLICIES: None})
        return None

    router.add(
        "DELETE",
        NS + "/removeOffloadPolicies",
        remove_offload_policies,
        "remove the namespace's offload policies (Pulsar's path)",
        ok=204,
    )


def _message_id(body: Any) -> Position:
    if not isinstance(body, dict) or "ledgerId" not in body or "entryId" not in body:
        raise InvalidInput('the body must be a message id: {"ledgerId": long, "entryId": long}')
    ids = (body["ledgerId"], body["entryId"])
    if not all(isinstance(i, int) and not isinstance(i, bool) and -1 <= i < 1 << 63 for i in ids):
        raise InvalidInput(f"invalid message id {body!r:.200}: ledgerId and entryId are 64-bit integers")
    return Position(*ids)


def _message_id_json(pos) -> dict[str, int]:
    if pos is None:
        return {"ledgerId": -1, "entryId": -1, "partitionIndex": -1}
    return {"ledgerId": int(pos[0]), "entryId": int(pos[1]), "partitionIndex": -1}


async def _managed_ledger(ctx: Context, path: dict):
    topic = _persistent(topic_name(**path))
    if await _kind(ctx, topic):
        raise NotFound(f"{topic} is a partitioned topic: offload its partitions")
    return await ctx.run_blocking(ctx.storage.open_managed_ledger, topic, False)


async def trigger_offload(ctx: Context, request: web.Request, **path: str) -> Any:
    before = _message_id(await read_json(request, "a message id"))
    ml = await _managed_ledger(ctx, path)
    try:
        await ctx.run_blocking(ctx.storage.offloader.trigger, ml, before)
    except InvalidConfiguration as e:
        raise PreconditionFailed(str(e)) from None
    return None


async def offload_status(ctx: Context, request: web.Request, **path: str) -> Any:
    ml = await _managed_ledger(ctx, path)
    st = ctx.storage.offloader.status(ml.topic)
    first = st.get("firstUnoffloadedMessage")
    if first is None:
        first = await ctx.run_blocking(ml.first_unoffloaded_position)
    return {
        "status": st["status"],
        "lastError": st.get("lastError") or "",
        "firstUnoffloadedMessage": _message_id_json(first),
    }
