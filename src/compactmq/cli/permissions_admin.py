"""pulsar-admin's ``grant-permission``, ``revoke-permission`` and ``permissions``, for topics and
namespaces alike (``/admin/v2/.../permissions/{role}``): a role gets a comma list of actions."""

from __future__ import annotations

import urllib.parse
from typing import Any, Callable

from ..errors import InvalidInput
from .admin_client import run_command
from .tenants_admin import comma_list


def _actions(text: str) -> list[str]:
    actions = comma_list(text)
    if not actions:
        raise InvalidInput("--actions needs at least one action, e.g. produce,consume")
    return actions


def _render_permissions(body: Any) -> str:
    if not body:
        return "no permissions granted"
    return "\n".join(
        f"{role}: {', '.join(actions) or '(no actions)'}" for role, actions in sorted(body.items())
    )


def add_permission_commands(sub, target: str, path_of: Callable[[str], str]) -> None:
    """pulsar-admin's ``grant-permission``, ``revoke-permission`` and ``permissions``."""

    # getattr(a, target): the positional argument these commands define ("topic" or "namespace")
    def role_path(a) -> str:
        return f"{path_of(getattr(a, target))}/permissions/{urllib.parse.quote(a.role, safe='')}"

    p = sub.add_parser("grant-permission", help=f"grant a role actions on a {target}")
    p.add_argument(target)
    p.add_argument("--role", required=True, help="the role (a token's subject, a user, a certificate's CN)")
    p.add_argument(
        "--actions",
        required=True,
        help="comma list: produce, consume (functions, packages, sinks, sources are stored too)",
    )

    def grant(a, c, o) -> None:
        c.request("POST", role_path(a), _actions(a.actions))
        o.done(f"granted {a.role} {','.join(_actions(a.actions))} on {getattr(a, target)}")

    p.set_defaults(func=run_command(grant))
    p = sub.add_parser("revoke-permission", help=f"revoke a role's permissions on a {target}")
    p.add_argument(target)
    p.add_argument("--role", required=True)

    def revoke(a, c, o) -> None:
        c.request("DELETE", role_path(a))
        o.done(f"revoked {a.role} on {getattr(a, target)}")

    p.set_defaults(func=run_command(revoke))
    p = sub.add_parser("permissions", help=f"show the permissions of a {target}")
    p.add_argument(target)
    p.set_defaults(
        func=run_command(
            lambda a, c, o: o.result(
                c.request("GET", f"{path_of(getattr(a, target))}/permissions"), _render_permissions
            )
        )
    )
