"""Cluster commands, named as pulsar-admin names them::

    compactmq brokers list CLUSTER                     live brokers (host:port)
    compactmq brokers leader-broker                    the leader
    compactmq brokers namespaces CLUSTER --url H:P     bundles a broker owns
    compactmq namespaces bundles T/NS                  the namespace's bundle boundaries
    compactmq namespaces unload T/NS [-b RANGE] [-d H:P]   unload one bundle, or each of them
    compactmq topics unload TOPIC                      close a topic on its owner
    compactmq topics lookup TOPIC                      the broker that serves a topic

A call about a topic or bundle that another broker owns answers 307; ``AdminClient`` follows it
to the owner (as pulsar-admin does), so any broker of the cluster can be the ``--admin-url``.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from ..naming import TopicName
from .admin_client import AdminClient, namespace_path, topic_path
from .admin_client import run_command as _run
from .output import Output


def _lookup(a: Any, c: AdminClient, o: Output) -> None:
    t = TopicName.parse(a.topic)
    local = urllib.parse.quote(t.local_name, safe="")
    body = c.request("GET", f"/lookup/v2/topic/{t.domain}/{t.tenant}/{t.namespace}/{local}")
    o.result(body, lambda b: str(b.get("brokerUrl") or b.get("brokerUrlTls") or ""))


def _unload_namespace(a: Any, c: AdminClient, o: Output) -> None:
    query = {"destinationBroker": a.destination_broker} if a.destination_broker else None
    if a.bundle:
        c.request("PUT", f"{namespace_path(a.namespace)}/{a.bundle}/unload", query=query)
    else:
        c.request("PUT", f"{namespace_path(a.namespace)}/unload")
    o.done(f"unloaded {a.namespace}" + (f" bundle {a.bundle}" if a.bundle else ""))


def _ranges(bundles: Any) -> list[str]:
    b = list((bundles or {}).get("boundaries") or [])
    return [f"{lo}_{hi}" for lo, hi in zip(b, b[1:])]


def _unload(a, c, o) -> None:
    c.request("PUT", topic_path(a.topic) + "/unload")
    o.done(f"unloaded {a.topic}")


def add_commands(topics: Any, namespaces: Any, subparsers: Any) -> None:
    p = topics.add_parser("unload", help="unload a topic: its owner closes it, clients reconnect")
    p.add_argument("topic")
    p.set_defaults(func=_run(_unload))
    p = topics.add_parser("lookup", help="the broker that serves a topic")
    p.add_argument("topic")
    p.set_defaults(func=_run(_lookup))

    p = namespaces.add_parser("bundles", help="the bundles (hash ranges) of a namespace")
    p.add_argument("namespace", help="tenant/namespace")
    p.set_defaults(
        func=_run(
            lambda a, c, o: o.result(c.request("GET", namespace_path(a.namespace) + "/bundles"), _render)
        )
    )
    p = namespaces.add_parser("unload", help="unload a bundle of a namespace (all of them without -b)")
    p.add_argument("namespace", help="tenant/namespace")
    p.add_argument("-b", "--bundle", help="the bundle range, e.g. 0x00000000_0x40000000")
    p.add_argument("-d", "--destinationBroker", dest="destination_broker", help="host:port to move it to")
    p.set_defaults(func=_run(_unload_namespace))

    brokers = subparsers.add_parser("brokers", help="the brokers of a cluster").add_subparsers(
        dest="brokers_command", metavar="SUBCOMMAND", required=True
    )
    p = brokers.add_parser("list", help="the live brokers of a cluster")
    p.add_argument("cluster")
    p.set_defaults(
        func=_run(lambda a, c, o: o.result(c.request("GET", f"/admin/v2/brokers/{_seg(a.cluster)}"), _lines))
    )
    p = brokers.add_parser("leader-broker", help="the leader broker")
    p.set_defaults(
        func=_run(
            lambda a, c, o: o.result(
                c.request("GET", "/admin/v2/brokers/leaderBroker"), lambda b: str(b.get("brokerId", ""))
            )
        )
    )
    p = brokers.add_parser("namespaces", help="the bundles a broker owns")
    p.add_argument("cluster")
    p.add_argument("--url", required=True, help="the broker, as host:port")
    p.set_defaults(
        func=_run(
            lambda a, c, o: o.result(
                c.request("GET", f"/admin/v2/brokers/{_seg(a.cluster)}/{_seg(a.url)}/ownedNamespaces"),
                lambda b: "\n".join(sorted(b)),
            )
        )
    )


def _seg(text: str) -> str:
    return urllib.parse.quote(text, safe=":")


def _lines(body: Any) -> str:
    return "\n".join(str(x) for x in body or [])


def _render(body: Any) -> str:
    return " ".join(_ranges(body))
