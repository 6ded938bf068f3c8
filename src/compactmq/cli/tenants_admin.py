"""``compactmq tenants list|create|update|get|delete``: a tenant's admin roles and allowed
clusters (Pulsar's TenantInfo) at ``/admin/v2/tenants/{tenant}``."""

from __future__ import annotations

import argparse
from typing import Any

from .admin_client import run_command


def _tenant_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("tenant")
    p.add_argument(
        "-r", "--admin-roles", default="", help="comma list of the roles that administer the tenant"
    )
    p.add_argument(
        "-c",
        "--allowed-clusters",
        default="",
        help="comma list of clusters the tenant may use (default: every cluster)",
    )


def comma_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _tenant_body(a) -> dict:
    body: dict = {"adminRoles": comma_list(a.admin_roles)}
    if comma_list(a.allowed_clusters):
        body["allowedClusters"] = comma_list(a.allowed_clusters)
    return body


def _render_tenant(body: Any) -> str:
    return (
        f"adminRoles: {', '.join(body.get('adminRoles') or []) or '(none)'}\n"
        f"allowedClusters: {', '.join(body.get('allowedClusters') or []) or '(none)'}"
    )


def _create(a, c, o) -> None:
    c.request("PUT", f"/admin/v2/tenants/{a.tenant}", _tenant_body(a))
    o.done(f"created {a.tenant}")


def _update(a, c, o) -> None:
    c.request("POST", f"/admin/v2/tenants/{a.tenant}", _tenant_body(a))
    o.done(f"updated {a.tenant}")


def _delete(a, c, o) -> None:
    c.request("DELETE", f"/admin/v2/tenants/{a.tenant}")
    o.done(f"deleted {a.tenant}")


def add_commands(tenants) -> None:
    """Add the tenant commands to the ``tenants`` sub-parser."""
    p = tenants.add_parser("list", help="list tenants")
    p.set_defaults(func=run_command(lambda a, c, o: o.result(c.request("GET", "/admin/v2/tenants"))))
    p = tenants.add_parser("create", help="create a tenant")
    _tenant_args(p)
    p.set_defaults(func=run_command(_create))
    p = tenants.add_parser("update", help="replace a tenant's admin roles and allowed clusters")
    _tenant_args(p)
    p.set_defaults(func=run_command(_update))
    p = tenants.add_parser("get", help="show a tenant's admin roles and allowed clusters")
    p.add_argument("tenant")
    p.set_defaults(
        func=run_command(
            lambda a, c, o: o.result(c.request("GET", f"/admin/v2/tenants/{a.tenant}"), _render_tenant)
        )
    )
    p = tenants.add_parser("delete", help="delete a tenant with no namespaces")
    p.add_argument("tenant")
    p.set_defaults(func=run_command(_delete))
