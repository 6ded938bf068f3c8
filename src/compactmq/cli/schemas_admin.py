"""``compactmq schemas get|upload|delete|compatibility TOPIC``: pulsar-admin's schema commands.

Each is one call to the admin REST API's schema paths (``/admin/v2/schemas/{tenant}/{ns}/{topic}``);
``upload`` and ``compatibility`` read a file holding a PostSchemaPayload, as pulsar-admin does::

    {"type": "AVRO", "schema": "<the definition, as a string>", "properties": {}}
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from ..errors import InvalidInput
from ..naming import TopicName
from .admin_client import AdminClient
from .admin_client import run_command as _run
from .output import Output


def schema_path(topic: str) -> str:
    t = TopicName.parse(topic)
    return f"/admin/v2/schemas/{t.tenant}/{t.namespace}/{urllib.parse.quote(t.local_name, safe='')}"


def _payload(filename: str) -> Any:
    try:
        with open(filename, encoding="utf-8") as f:
            body = json.load(f)
    except OSError as e:
        raise InvalidInput(f"cannot read {filename}: {e.strerror}") from None
    except ValueError as e:
        raise InvalidInput(f"{filename} is not JSON: {e}") from None
    if not isinstance(body, dict) or "type" not in body:
        raise InvalidInput(f'{filename} must hold {{"type": ..., "schema": ..., "properties": {{...}}}}')
    if isinstance(body.get("schema"), (dict, list)):  # a definition written inline as JSON
        body["schema"] = json.dumps(body["schema"])
    return body


def _get(a: argparse.Namespace, c: AdminClient, out: Output) -> None:
    if a.all_version:
        out.result(c.request("GET", f"{schema_path(a.topic)}/schemas"))
    elif a.version is not None:
        out.result(c.request("GET", f"{schema_path(a.topic)}/schema/{a.version}"))
    else:
        out.result(c.request("GET", f"{schema_path(a.topic)}/schema"))


def _upload(a: argparse.Namespace, c: AdminClient, out: Output) -> None:
    body = c.request("POST", f"{schema_path(a.topic)}/schema", _payload(a.filename))
    version = (body or {}).get("version", {})
    out.done(
        f"schema version {version.get('version') if isinstance(version, dict) else version} "
        f"registered on {a.topic}"
    )


def _delete(a: argparse.Namespace, c: AdminClient, out: Output) -> None:
    c.request("DELETE", f"{schema_path(a.topic)}/schema", query={"force": "true"} if a.force else None)
    out.done(f"schema of {a.topic} deleted")


def _compatibility(a: argparse.Namespace, c: AdminClient, out: Output) -> int:
    body = c.request("POST", f"{schema_path(a.topic)}/compatibility", _payload(a.filename)) or {}
    out.result(
        body,
        lambda b: (
            ("compatible" if b.get("compatibility") else f"incompatible: {b.get('reason', '')}")
            + f" (strategy {b.get('schemaCompatibilityStrategy')})"
        ),
    )
    return 0 if body.get("compatibility") else 1


def add_parser(subparsers) -> None:
    schemas = subparsers.add_parser("schemas", help="manage topic schemas").add_subparsers(
        dest="schemas_command", metavar="SUBCOMMAND", required=True
    )
    p = schemas.add_parser("get", help="show a topic's schema")
    p.add_argument("topic")
    p.add_argument("-v", "--version", type=int, help="this version rather than the latest")
    p.add_argument("-a", "--all-version", action="store_true", help="every version in force")
    p.set_defaults(func=_run(_get))
    p = schemas.add_parser("upload", help="register a schema (a PostSchemaPayload JSON file)")
    p.add_argument("topic")
    p.add_argument("-f", "--filename", required=True, help="JSON file: {type, schema, properties}")
    p.set_defaults(func=_run(_upload))
    p = schemas.add_parser("delete", help="delete a topic's schema")
    p.add_argument("topic")
    p.add_argument(
        "-f", "--force", action="store_true", help="erase every version, not only the one in force"
    )
    p.set_defaults(func=_run(_delete))
    p = schemas.add_parser("compatibility", help="test a schema against the topic's compatibility strategy")
    p.add_argument("topic")
    p.add_argument("-f", "--filename", required=True, help="JSON file: {type, schema, properties}")
    p.set_defaults(func=_run(_compatibility))
