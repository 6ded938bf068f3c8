"""``compactmq topics|namespaces|tenants ...``: a pulsar-admin-shaped client of the admin REST API.

Thin by design: each command turns its arguments into one REST call (Pulsar admin v2 paths),
then hands the response to ``Output``. Global options come first, as with pulsar-admin::

    compactmq --admin-url http://127.0.0.1:8080 --output json topics compaction-status persistent://public/default/t

The REST API answers errors as ``{"reason": "..."}``; the CLI prints that reason on one line
and exits 1 (for 401 and 403 with what to do next). A broker with security on is reached with
pulsar-admin's global options (``--auth-plugin``, ``--auth-params``, ``--tls-*``, an ``https://``
``--admin-url``; see ``admin_auth``).

The commands live in one module per resource, each adding its sub-commands to the parsers this
module creates: ``topics_admin`` (create, list, delete, stats), ``compaction_admin`` (compact,
compaction-status), ``policies_admin`` and ``permissions_admin`` (for topics and namespaces),
``namespaces_admin``, ``tenants_admin``, and ``offload_admin``, ``cluster_admin``, ``export``,
``latest``. ``admin_client`` is the HTTP client and the paths they share.

Policies (compaction threshold, compaction max/min lag, retention, compaction strategy, retain-null-key, ...)
exist for topics and namespaces alike; each is declared once, with its pulsar-admin verb and flags,
in ``compactmq.admin.policies``, and gets ``set-``, ``get-`` and ``remove-`` commands under both
``topics`` and ``namespaces``.
"""

from __future__ import annotations

from . import compaction_admin, namespaces_admin, tenants_admin, topics_admin
from .admin_client import AdminClient, namespace_path, run_command, topic_path
from .compaction_admin import render_progress, wait_for_compaction
from .namespaces_admin import NAMESPACE_POLICIES
from .permissions_admin import add_permission_commands
from .policies_admin import add_policy_commands

# the names command modules (latest, export, ...) and tests import from here
_run = run_command
__all__ = [
    "AdminClient",
    "add_parser",
    "add_policy_commands",
    "namespace_path",
    "render_progress",
    "topic_path",
    "wait_for_compaction",
]


def add_parser(subparsers) -> None:
    topics = subparsers.add_parser("topics", help="manage topics and their compaction").add_subparsers(
        dest="topics_command", metavar="SUBCOMMAND", required=True
    )
    topics_admin.add_commands(topics)
    compaction_admin.add_commands(topics)
    add_policy_commands(topics, "topic", topic_path)
    add_permission_commands(topics, "topic", topic_path)
    from .export import add_commands as _add_export_commands

    _add_export_commands(topics)
    from .latest import add_commands as _add_latest_commands

    _add_latest_commands(topics)

    namespaces = subparsers.add_parser(
        "namespaces", help="manage namespaces and their policies"
    ).add_subparsers(dest="namespaces_command", metavar="SUBCOMMAND", required=True)
    namespaces_admin.add_commands(namespaces)
    add_policy_commands(namespaces, "namespace", namespace_path)
    add_permission_commands(namespaces, "namespace", namespace_path)
    add_policy_commands(namespaces, "namespace", namespace_path, NAMESPACE_POLICIES)
    from .offload_admin import add_commands as add_offload_commands  # tiered storage

    add_offload_commands(topics, namespaces)
    from .cluster_admin import add_commands as add_cluster_commands  # brokers, bundles, unload

    add_cluster_commands(topics, namespaces, subparsers)

    tenants = subparsers.add_parser("tenants", help="manage tenants").add_subparsers(
        dest="tenants_command", metavar="SUBCOMMAND", required=True
    )
    tenants_admin.add_commands(tenants)
