"""The namespace policy ``autoTopicCreation`` (Pulsar's ``AutoTopicCreationOverride``):
``GET|POST|DELETE /admin/v2/namespaces/{tenant}/{namespace}/autoTopicCreation``.

The body is ``{"allowAutoTopicCreation": bool, "topicType": "partitioned"|"non-partitioned",
"defaultNumPartitions": int}``; when set it replaces the broker's three auto-creation settings
for the topics of that namespace (the rule itself lives in ``broker.namespaces``). A body
Pulsar refuses answers 412 with Pulsar's reason; GET answers ``null`` when nothing is set.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..auth.policy_rules import Target, check_policy_values
from ..broker.namespaces import POLICY_KEY, validate_override
from ..errors import NotFound
from .common import Context, read_json
from .router import Router

PATH = "/admin/v2/namespaces/{tenant}/{namespace}/autoTopicCreation"


def add_routes(router: Router) -> None:
    router.add("GET", PATH, get_auto_topic_creation, "namespace policy: automatic topic creation")
    router.add(
        "POST",
        PATH,
        set_auto_topic_creation,
        "set the namespace policy: automatic topic creation",
        body="object",
        ok=204,
    )
    router.add(
        "DELETE",
        PATH,
        remove_auto_topic_creation,
        "remove the namespace policy: automatic topic creation (the broker settings apply)",
        ok=204,
    )


async def _require(ctx: Context, namespace: str) -> None:
    if not await ctx.run_blocking(ctx.resources.namespaces.exists, namespace):
        raise NotFound(f"Namespace does not exist: {namespace}")


async def get_auto_topic_creation(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
    name = f"{tenant}/{namespace}"
    await _require(ctx, name)
    return (await ctx.run_blocking(ctx.policies.get_namespace_policies, name)).get(POLICY_KEY)


async def set_auto_topic_creation(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
    name = f"{tenant}/{namespace}"
    await _require(ctx, name)
    value = validate_override(await read_json(request, "the autoTopicCreation object"))
    checked = check_policy_values({POLICY_KEY: value}, Target(ctx.service.config, name))
    value = checked[POLICY_KEY]
    await ctx.run_blocking(ctx.policies.set_namespace_policy, name, POLICY_KEY, value)
    return None


async def remove_auto_topic_creation(ctx: Context, request: web.Request, tenant: str, namespace: str) -> Any:
    name = f"{tenant}/{namespace}"
    await _require(ctx, name)
    await ctx.run_blocking(ctx.policies.remove_namespace_policy, name, POLICY_KEY)
    return None
