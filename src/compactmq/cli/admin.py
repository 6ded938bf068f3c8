"""``compactmq topics|namespaces|tenants ...``: a pulsar-admin-shaped client of the admin REST API.

Thin by design: each command turns its arguments into one REST call (Pulsar admin v2 paths),
then hands the response to ``Output``. Global options come first, as with pulsar-admin::

    compactmq --admin-url http://127.0.0.1:8080 --output json topics compaction-status persistent://public/default/t

The REST API answers errors as ``{"reason": "..."}``; the CLI prints that reason on one line
and exits 1 (for 401 and 403 with what to do next). A broker with security on is reached with
pulsar-admin's global options (``--auth-plugin``, ``--auth-params``, ``--tls-*``, an ``https://``
``--admin-url``; see ``admin_auth``).

Policies (compaction threshold, compaction max/min lag, retention, compaction strategy, retain-null-key, ...)
exist for topics and namespaces alike; each is declared once, with its pulsar-admin verb and flags,
in ``compactmq.admin.policies``, and gets ``set-``, ``get-`` and ``remove-`` commands under both
``topics`` and ``namespaces``.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterable

from ..errors import AdminRequestError, InvalidInput
from ..naming import TopicName
from .admin_auth import ClientAuth, client_auth, ssl_context
from .output import Output
from ..admin.policies import CliForm, cli_forms


#: 307s followed for one call (a non-owner to the leader to the owner is two)
MAX_REDIRECTS = 5


class AdminClient:
    """Minimal HTTP client for the admin REST API (stdlib only: the CLI must start fast)."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 30.0,
        auth: ClientAuth | None = None,
        tls: ssl.SSLContext | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.auth = auth or ClientAuth()
        self.tls = tls

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AdminClient:
        """The client the global options describe (admin URL, credentials, TLS)."""
        auth = client_auth(
            getattr(args, "auth_plugin", None),
            getattr(args, "auth_params", None),
            getattr(args, "tls_cert_file", None),
            getattr(args, "tls_key_file", None),
        )
        tls = None
        if args.admin_url.lower().startswith("https://"):
            tls = ssl_context(
                getattr(args, "tls_trust_cert_path", None),
                getattr(args, "tls_allow_insecure", False),
                getattr(args, "tls_enable_hostname_verification", False),
                auth,
            )
        elif auth.method == "tls":
            raise InvalidInput(
                "TLS authentication needs an https:// --admin-url (the broker's webServicePortTls)"
            )
        return cls(args.admin_url, auth=auth, tls=tls)

    def request(self, method: str, path: str, body: Any = None, query: dict | None = None) -> Any:
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None
        headers = {"Accept": "application/json"}
        if self.auth.authorization:
            headers["Authorization"] = self.auth.authorization
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            raw = self._send_following_redirects(url, data, method, headers)
        except urllib.error.HTTPError as e:
            raise AdminRequestError(
                f"{_reason(e)} (HTTP {e.code}){self._next_step(e.code)}", e.code
            ) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLError):
                raise AdminRequestError(
                    f"TLS with the admin API at {self.base_url} failed ({_tls_reason(e.reason)}); "
                    "pass the broker's CA with --tls-trust-cert-path (or --tls-allow-insecure)"
                ) from None
            raise AdminRequestError(
                f"cannot reach the admin API at {self.base_url} ({e.reason}); "
                "is the broker running? (set --admin-url)"
            ) from None
        except ssl.SSLError as e:
            raise AdminRequestError(
                f"TLS with the admin API at {self.base_url} failed ({_tls_reason(e)})"
            ) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def _send_following_redirects(self, url: str, data: bytes | None, method: str, headers: dict) -> bytes:
        """The response body; a 307/308 (a cluster's broker sending the call to the owner of the
        topic or bundle) is followed with the same method and body, up to ``MAX_REDIRECTS`` times,
        never from https:// to http://."""
        for _ in range(MAX_REDIRECTS):
            req = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout, context=self.tls) as resp:
                    return resp.read()
            except urllib.error.HTTPError as e:
                location = e.headers.get("Location") if e.code in (307, 308) else None
                if not location:
                    raise
                target = urllib.parse.urljoin(url, location)
                if url.lower().startswith("https://") and not target.lower().startswith("https://"):
                    raise
                url = target
        raise AdminRequestError(f"more than {MAX_REDIRECTS} redirects from the admin API at {self.base_url}")

    def _next_step(self, status: int) -> str:
        """What to do after a 401 or 403, appended to the broker's reason."""
        if status == 401 and self.auth.method is None:
            return (
                "; the broker requires authentication: pass --auth-plugin token --auth-params "
                "token:<jwt> (or file:///path), basic, or tls with a client certificate"
            )
        if status == 401:
            return f"; check the {self.auth.method} credentials given with --auth-params"
        if status == 403:
            return "; this needs a role with more rights (the tenant's admin role or a superuser)"
        return ""


def _tls_reason(e: ssl.SSLError) -> str:
    return getattr(e, "verify_message", None) or getattr(e, "reason", None) or type(e).__name__


def _reason(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read() or b"{}")
        if isinstance(body, dict) and body.get("reason"):
            return str(body["reason"])
    except ValueError:
        pass
    return e.reason or "request failed"


# --- paths -------------------------------------------------------------------------------------


def topic_path(name: str) -> str:
    t = TopicName.parse(name)
    local = urllib.parse.quote(t.local_name, safe="")
    return f"/admin/v2/{t.domain}/{t.tenant}/{t.namespace}/{local}"


def namespace_path(name: str) -> str:
    parts = name.split("/")
    if len(parts) != 2 or not all(parts):
        raise InvalidInput(f"invalid namespace {name!r}: expected tenant/namespace")
    return f"/admin/v2/namespaces/{parts[0]}/{parts[1]}"


# --- policies ----------------------------------------------------------------------------------


def add_policy_commands(
    sub, target: str, path_of: Callable[[str], str], forms: Iterable[tuple[str, CliForm]] | None = None
) -> None:
    """``set-|get-|<remove>-<verb>`` for each (REST path suffix, CLI form) of ``forms`` on ``target``
    ("topic" or "namespace"); by default, every declared policy ``target`` has (``admin.policies``)."""
    set_method_attr = "topic_set_method" if target == "topic" else "namespace_set_method"
    for suffix, form in cli_forms(target) if forms is None else forms:
        set_help, get_help, remove_help = form.helps or (
            f"set the {form.verb} policy of a {target}",
            f"show the {form.verb} policy of a {target}",
            f"remove the {form.verb} policy of a {target}",
        )
        p = sub.add_parser(f"set-{form.verb}", help=set_help)
        p.add_argument(target)
        form.add_args(p)
        p.set_defaults(
            func=_run(
                lambda a, c, o, form=form, suffix=suffix: (
                    c.request(
                        getattr(form, set_method_attr),
                        f"{path_of(getattr(a, target))}/{suffix}",
                        form.body_from_args(a),
                    ),
                    o.done(f"{form.verb} set on {getattr(a, target)}"),
                )
            )
        )
        p = sub.add_parser(f"get-{form.verb}", help=get_help)
        p.add_argument(target)
        p.set_defaults(
            func=_run(
                lambda a, c, o, form=form, suffix=suffix: o.result(
                    c.request("GET", f"{path_of(getattr(a, target))}/{suffix}"), form.render
                )
            )
        )
        p = sub.add_parser(f"{form.remove_verb}-{form.verb}", help=remove_help)
        p.add_argument(target)
        p.set_defaults(
            func=_run(
                lambda a, c, o, form=form, suffix=suffix: (
                    c.request("DELETE", f"{path_of(getattr(a, target))}/{suffix}"),
                    o.done(f"{form.verb} removed from {getattr(a, target)}"),
                )
            )
        )


# --- permissions (namespaces and topics alike) ------------------------------------------------


def _actions(text: str) -> list[str]:
    actions = _comma_list(text)
    if not actions:
        raise InvalidInput("--actions needs at least one action, e.g. produce,consume")
    return actions


def _render_permissions(body: Any) -> str:
    if not body:
        return "no permissions granted"
    return "\n".join(
        f"{role}: {', '.join(actions) or '(no actions)'}" for role, actions in sorted(body.items())
    )


def _add_permission_commands(sub, target: str, path_of: Callable[[str], str]) -> None:
    """pulsar-admin's ``grant-permission``, ``revoke-permission`` and ``permissions``."""

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
    p.set_defaults(
        func=_run(
            lambda a, c, o: (
                c.request("POST", role_path(a), _actions(a.actions)),
                o.done(f"granted {a.role} {','.join(_actions(a.actions))} on {getattr(a, target)}"),
            )
        )
    )
    p = sub.add_parser("revoke-permission", help=f"revoke a role's permissions on a {target}")
    p.add_argument(target)
    p.add_argument("--role", required=True)
    p.set_defaults(
        func=_run(
            lambda a, c, o: (
                c.request("DELETE", role_path(a)),
                o.done(f"revoked {a.role} on {getattr(a, target)}"),
            )
        )
    )
    p = sub.add_parser("permissions", help=f"show the permissions of a {target}")
    p.add_argument(target)
    p.set_defaults(
        func=_run(
            lambda a, c, o: o.result(
                c.request("GET", f"{path_of(getattr(a, target))}/permissions"), _render_permissions
            )
        )
    )


# --- tenants -----------------------------------------------------------------------------------


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


def _comma_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _tenant_body(a) -> dict:
    body: dict = {"adminRoles": _comma_list(a.admin_roles)}
    if _comma_list(a.allowed_clusters):
        body["allowedClusters"] = _comma_list(a.allowed_clusters)
    return body


def _render_tenant(body: Any) -> str:
    return (
        f"adminRoles: {', '.join(body.get('adminRoles') or []) or '(none)'}\n"
        f"allowedClusters: {', '.join(body.get('allowedClusters') or []) or '(none)'}"
    )


def _auto_topic_creation_body(a: argparse.Namespace) -> dict:
    body: dict[str, Any] = {"allowAutoTopicCreation": bool(a.enable), "topicType": a.type}
    if a.num_partitions is not None:
        body["defaultNumPartitions"] = a.num_partitions
    return body


def _render_auto_topic_creation(body: Any) -> str:
    if not body:
        return "not set (the broker settings apply)"
    if not body.get("allowAutoTopicCreation"):
        return "disabled"
    if body.get("topicType") == "partitioned":
        return f"enabled: partitioned, {body.get('defaultNumPartitions')} partitions"
    return f"enabled: {body.get('topicType', 'non-partitioned')}"


def _auto_topic_creation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-e", "--enable", action="store_true", help="allow automatic topic creation (default: forbid)"
    )
    p.add_argument(
        "-t",
        "--type",
        default="non-partitioned",
        choices=("partitioned", "non-partitioned"),
        help="type of the topics created",
    )
    p.add_argument(
        "-n",
        "--num-partitions",
        type=int,
        default=None,
        help="partitions of an auto-created partitioned topic",
    )


#: policies only a namespace has (pulsar-admin's verbs and flags)
NAMESPACE_POLICIES = (
    (
        "autoTopicCreation",
        CliForm(
            "auto-topic-creation",
            _auto_topic_creation_args,
            _auto_topic_creation_body,
            _render_auto_topic_creation,
            helps=(
                "allow or forbid creating topics by using them",
                "show the automatic topic creation policy",
                "remove the policy (the broker settings apply)",
            ),
        ),
    ),
)


# --- compaction status with a live progress bar -----------------------------------------------


def render_progress(status: dict, width: int = 30) -> str:
    """One line for a compaction status, with a bar when the broker reports progress."""
    state = status.get("status", "?")
    prog = status.get("progress") or {}
    counts = status.get("partitionCounts")  # a partitioned topic: its aggregate status
    if counts:
        n = sum(counts.values())
        by = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        state_text = f"{state} ({n} partitions: {by})"
    else:
        state_text = state
    if state != "RUNNING" or not prog:
        text = state_text if not status.get("lastError") else f"{state_text}: {status['lastError']}"
        per = status.get("partitions")
        if isinstance(per, dict) and per:
            text += "".join(f"\n  {name}: {render_progress(s, width)}" for name, s in sorted(per.items()))
        return text
    done = int(prog.get("entriesProcessed", 0))
    total = int(prog.get("entriesTotal", 0) or 0)
    phase = prog.get("phase", "")
    if total > 0:
        frac = min(1.0, done / total)
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        eta = prog.get("etaSeconds")
        tail = f"  eta {eta:.0f}s" if isinstance(eta, (int, float)) else ""
        whole = f"  ({sum(counts.values())} partitions)" if counts else ""
        return f"RUNNING {phase:<10} [{bar}] {done:,}/{total:,} entries ({frac:.0%}){tail}{whole}"
    return f"RUNNING {phase:<10} {done:,} entries"


def wait_for_compaction(
    client: AdminClient, topic: str, out: Output, poll_seconds: float = 0.5, stream=None
) -> dict:
    """Poll the status until it leaves RUNNING, drawing progress on ``stream`` (stderr as it is at
    the call, not at import: ``main`` may run with its streams redirected); return the final status."""
    stream = stream or sys.stderr
    path = f"{topic_path(topic)}/compaction"
    live = hasattr(stream, "isatty") and stream.isatty()
    last = None
    while True:
        status = client.request("GET", path) or {}
        line = render_progress(status)
        if not out.json and line != last:
            stream.write(("\r\033[K" + line) if live else line + "\n")
            stream.flush()
            last = line
        if status.get("status") != "RUNNING":
            if live and not out.json:
                stream.write("\n")
            return status
        time.sleep(poll_seconds)


def _finish_status(status: dict, out: Output) -> int:
    out.result(status, render_progress)
    if status.get("status") == "ERROR":
        if not out.json:
            print(
                f"compactmq: error: compaction failed: {status.get('lastError') or 'no reason given'}",
                file=sys.stderr,
            )
        return 1
    return 0


def _compact(a, c: AdminClient, out: Output) -> int:
    c.request("PUT", f"{topic_path(a.topic)}/compaction")
    if not a.wait:
        out.done(f"compaction triggered for {a.topic}")
        return 0
    return _finish_status(wait_for_compaction(c, a.topic, out), out)


def _compaction_status(a, c: AdminClient, out: Output) -> int:
    if a.wait_complete:
        status = wait_for_compaction(c, a.topic, out)
        if not getattr(a, "per_partition", False):
            return _finish_status(status, out)
    query = "?perPartition=true" if getattr(a, "per_partition", False) else ""
    return _finish_status(c.request("GET", f"{topic_path(a.topic)}/compaction{query}") or {}, out)


# --- wiring ------------------------------------------------------------------------------------


def _run(fn: Callable[[argparse.Namespace, AdminClient, Output], Any]):
    def run(args: argparse.Namespace) -> int:
        result = fn(args, AdminClient.from_args(args), Output(args.output))
        return result if isinstance(result, int) else 0

    return run


def _namespace_of_topics_arg(ns: str) -> str:
    return namespace_path(ns).replace("/admin/v2/namespaces/", "/admin/v2/persistent/")


def add_parser(subparsers) -> None:
    topics = subparsers.add_parser("topics", help="manage topics and their compaction").add_subparsers(
        dest="topics_command", metavar="SUBCOMMAND", required=True
    )

    p = topics.add_parser("create", help="create a non-partitioned topic")
    p.add_argument("topic")
    p.set_defaults(
        func=_run(lambda a, c, o: (c.request("PUT", topic_path(a.topic)), o.done(f"created {a.topic}")))
    )
    p = topics.add_parser("create-partitioned-topic", help="create a partitioned topic")
    p.add_argument("topic")
    p.add_argument("-p", "--partitions", type=int, required=True)
    p.set_defaults(
        func=_run(
            lambda a, c, o: (
                c.request("PUT", f"{topic_path(a.topic)}/partitions", a.partitions),
                o.done(f"created {a.topic} with {a.partitions} partitions"),
            )
        )
    )
    p = topics.add_parser("list", help="list the topics of a namespace")
    p.add_argument("namespace", help="tenant/namespace")
    p.set_defaults(
        func=_run(lambda a, c, o: o.result(c.request("GET", _namespace_of_topics_arg(a.namespace))))
    )
    p = topics.add_parser("list-partitioned-topics", help="list the partitioned topics of a namespace")
    p.add_argument("namespace", help="tenant/namespace")
    p.set_defaults(
        func=_run(
            lambda a, c, o: o.result(c.request("GET", _namespace_of_topics_arg(a.namespace) + "/partitioned"))
        )
    )
    p = topics.add_parser("delete", help="delete a topic")
    p.add_argument("topic")
    p.add_argument("-f", "--force", action="store_true", help="delete even with producers/consumers attached")
    p.set_defaults(
        func=_run(
            lambda a, c, o: (
                c.request("DELETE", topic_path(a.topic), query={"force": "true"} if a.force else None),
                o.done(f"deleted {a.topic}"),
            )
        )
    )
    p = topics.add_parser("delete-partitioned-topic", help="delete a partitioned topic and its partitions")
    p.add_argument("topic")
    p.add_argument("-f", "--force", action="store_true")
    p.set_defaults(
        func=_run(
            lambda a, c, o: (
                c.request(
                    "DELETE",
                    f"{topic_path(a.topic)}/partitions",
                    query={"force": "true"} if a.force else None,
                ),
                o.done(f"deleted {a.topic}"),
            )
        )
    )
    p = topics.add_parser("stats", help="show a topic's stats, including compaction")
    p.add_argument("topic")
    p.set_defaults(func=_run(lambda a, c, o: o.result(c.request("GET", f"{topic_path(a.topic)}/stats"))))
    p = topics.add_parser(
        "internal-stats",
        aliases=["stats-internal"],
        help="show ledgers, cursors, compacted ledger and horizon",
    )
    p.add_argument("topic")
    p.set_defaults(
        func=_run(lambda a, c, o: o.result(c.request("GET", f"{topic_path(a.topic)}/internalStats")))
    )
    p = topics.add_parser("compact", help="trigger compaction of a topic")
    p.add_argument("topic")
    p.add_argument("-w", "--wait", action="store_true", help="wait for it to finish, showing progress")
    p.set_defaults(func=_run(_compact))
    p = topics.add_parser("compaction-status", help="show the status of the last compaction")
    p.add_argument("topic")
    p.add_argument(
        "-w",
        "--wait-complete",
        action="store_true",
        help="wait while it runs, showing progress; exit 1 if it fails",
    )
    p.add_argument(
        "--per-partition",
        action="store_true",
        help="a partitioned topic: also show each partition's status",
    )
    p.set_defaults(func=_run(_compaction_status))
    add_policy_commands(topics, "topic", topic_path)
    _add_permission_commands(topics, "topic", topic_path)
    from .export import add_commands as _add_export_commands

    _add_export_commands(topics)
    from .latest import add_commands as _add_latest_commands

    _add_latest_commands(topics)

    namespaces = subparsers.add_parser(
        "namespaces", help="manage namespaces and their policies"
    ).add_subparsers(dest="namespaces_command", metavar="SUBCOMMAND", required=True)
    p = namespaces.add_parser("create", help="create a namespace")
    p.add_argument("namespace", help="tenant/namespace")
    p.add_argument("-b", "--bundles", type=int, help="number of bundles (default: the broker's)")
    p.set_defaults(
        func=_run(
            lambda a, c, o: (
                c.request(
                    "PUT",
                    namespace_path(a.namespace),
                    {"bundles": {"numBundles": a.bundles}} if a.bundles is not None else None,
                ),
                o.done(f"created {a.namespace}"),
            )
        )
    )
    p = namespaces.add_parser("list", help="list the namespaces of a tenant")
    p.add_argument("tenant")
    p.set_defaults(func=_run(lambda a, c, o: o.result(c.request("GET", f"/admin/v2/namespaces/{a.tenant}"))))
    p = namespaces.add_parser("topics", help="list the topics of a namespace (every domain with --mode ALL)")
    p.add_argument("namespace", help="tenant/namespace")
    p.add_argument("-m", "--mode", default="PERSISTENT", choices=("PERSISTENT", "NON_PERSISTENT", "ALL"))
    p.set_defaults(
        func=_run(
            lambda a, c, o: o.result(
                c.request("GET", f"{namespace_path(a.namespace)}/topics", query={"mode": a.mode})
            )
        )
    )
    p = namespaces.add_parser("delete", help="delete an empty namespace")
    p.add_argument("namespace", help="tenant/namespace")
    p.set_defaults(
        func=_run(
            lambda a, c, o: (
                c.request("DELETE", namespace_path(a.namespace)),
                o.done(f"deleted {a.namespace}"),
            )
        )
    )
    add_policy_commands(namespaces, "namespace", namespace_path)
    _add_permission_commands(namespaces, "namespace", namespace_path)
    add_policy_commands(namespaces, "namespace", namespace_path, NAMESPACE_POLICIES)
    from .offload_admin import add_commands as add_offload_commands  # tiered storage

    add_offload_commands(topics, namespaces)
    from .cluster_admin import add_commands as add_cluster_commands  # brokers, bundles, unload

    add_cluster_commands(topics, namespaces, subparsers)

    tenants = subparsers.add_parser("tenants", help="manage tenants").add_subparsers(
        dest="tenants_command", metavar="SUBCOMMAND", required=True
    )
    p = tenants.add_parser("list", help="list tenants")
    p.set_defaults(func=_run(lambda a, c, o: o.result(c.request("GET", "/admin/v2/tenants"))))
    p = tenants.add_parser("create", help="create a tenant")
    _tenant_args(p)
    p.set_defaults(
        func=_run(
            lambda a, c, o: (
                c.request("PUT", f"/admin/v2/tenants/{a.tenant}", _tenant_body(a)),
                o.done(f"created {a.tenant}"),
            )
        )
    )
    p = tenants.add_parser("update", help="replace a tenant's admin roles and allowed clusters")
    _tenant_args(p)
    p.set_defaults(
        func=_run(
            lambda a, c, o: (
                c.request("POST", f"/admin/v2/tenants/{a.tenant}", _tenant_body(a)),
                o.done(f"updated {a.tenant}"),
            )
        )
    )
    p = tenants.add_parser("get", help="show a tenant's admin roles and allowed clusters")
    p.add_argument("tenant")
    p.set_defaults(
        func=_run(lambda a, c, o: o.result(c.request("GET", f"/admin/v2/tenants/{a.tenant}"), _render_tenant))
    )
    p = tenants.add_parser("delete", help="delete a tenant with no namespaces")
    p.add_argument("tenant")
    p.set_defaults(
        func=_run(
            lambda a, c, o: (
                c.request("DELETE", f"/admin/v2/tenants/{a.tenant}"),
                o.done(f"deleted {a.tenant}"),
            )
        )
    )
