"""Several brokers, one cluster: membership, namespace bundles, bundle ownership, lookups.

Cluster mode is on when ``metadataStoreUrl`` names a shared store (``zk:``): brokers that share
it and ``clusterName`` form a cluster. With the embedded default (one broker) nothing here runs:
``BrokerService.cluster`` stays None and the broker serves every topic, exactly as before.

* ``bundles``     the hash ranges of a namespace and Pulsar's topic -> bundle hash
* ``membership``  this broker's ephemeral registration and load report; the leader election
* ``service``     ``ClusterService``: owned bundles, lookup decisions (Connect / Redirect),
                  assignment by the leader to the least-loaded broker, unload, shutdown
* ``settle``      waiting out a handoff: a lookup or topic load meeting a bundle in flux (or a
                  broker not joined yet) waits up to ``SETTLE_SECONDS`` before a refusal
The store paths are written in ``storage.resources.cluster``; nothing here sees one.
"""

from __future__ import annotations

from typing import Any, Mapping

from .bundles import Bundle
from .service import (
    ClusterService,
    Decision,
    check_opened_under_current_ownership,
    check_topic_owned,
    load_failed_on_lost_ownership,
)
from .settle import joined_cluster, settled_decision, store_reachable

#: ``metadataStoreUrl`` schemes whose data other processes share
SHARED_STORE_SCHEMES = ("zk",)


def cluster_enabled(config: Mapping[str, Any]) -> bool:
    """Whether this broker joins a cluster (its metadata store is shared)."""
    url = str(config.get("metadataStoreUrl") or "").strip()
    return url.partition(":")[0] in SHARED_STORE_SCHEMES


__all__ = [
    "Bundle",
    "ClusterService",
    "Decision",
    "check_opened_under_current_ownership",
    "check_topic_owned",
    "cluster_enabled",
    "joined_cluster",
    "load_failed_on_lost_ownership",
    "settled_decision",
    "store_reachable",
]
