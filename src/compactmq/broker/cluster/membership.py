"""Membership: this broker's registration and load report, the other brokers, the leader.

A broker in cluster mode writes one ephemeral key, ``/loadbalance/brokers/{host:webport}`` (the
id Pulsar calls ``lookupServiceAddress``: the advertised host and the web port), holding its URLs
and its load report (Pulsar's ``LocalBrokerData`` names: ``webServiceUrl``, ``pulsarServiceUrl``,
``advertisedListeners``, ``numBundles``, ``bundles``, ``numTopics``, ``lastUpdate``...). The report
is rewritten when the broker takes or gives up a bundle, and at most every
``loadBalancerReportUpdateMinIntervalMillis`` when only its topic count moved.

Every broker also runs for leader: the first to create the ephemeral ``/loadbalance/leader`` leads
(it assigns unowned bundles, see ``ownership``) until its session ends; the others watch the key
and run again when it goes. Everything here is blocking (store calls) and runs in the broker's
thread pool or on the store's notification thread, never on the event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from ...config import VERSION
from ...storage.metadata_store import MetadataStoreError, NotificationType

log = logging.getLogger(__name__)


def broker_id_of(web_url: str, web_url_tls: str | None) -> str:
    """``host:port`` of the web service (the plain port, else the TLS one)."""
    parts = urlsplit(web_url or web_url_tls or "")
    if not parts.hostname or parts.port is None:
        raise ValueError(f"a broker in a cluster needs a web port (got {web_url!r})")
    return f"{parts.hostname}:{parts.port}"


def registration_data(service: Any, cluster_name: str) -> dict[str, Any]:
    """The URLs part of this broker's ``LocalBrokerData``."""
    listeners = service.listeners
    named = {} if listeners is None else listeners.named
    return {
        "webServiceUrl": service.web_url or "",
        "webServiceUrlTls": service.web_url_tls or "",
        "pulsarServiceUrl": service.broker_url or "",
        "pulsarServiceUrlTls": service.broker_url_tls or "",
        "advertisedListeners": {
            name: {"brokerServiceUrl": lst.broker_url, "brokerServiceUrlTls": lst.broker_url_tls}
            for name, lst in named.items()
        },
        "persistentTopicsEnabled": True,
        "nonPersistentTopicsEnabled": True,
        "brokerVersionString": VERSION,
        "clusterName": cluster_name,
        "loadReportType": "LocalBrokerData",
    }


class Membership:
    """Registration, load report and leader election of one broker (blocking methods)."""

    def __init__(self, resources: Any, broker_id: str, base_data: dict[str, Any]) -> None:
        self.brokers_res = resources.brokers
        self.leader_res = resources.leader
        self.broker_id = broker_id
        self.base = base_data
        self.load: dict[str, Any] = {"numBundles": 0, "bundles": [], "numTopics": 0}
        self._version: int | None = None
        self._lock = threading.Lock()
        self.is_leader = False
        self.leader_id: str | None = None
        self.closed = False
        self._watch: Any = None

    def _data(self) -> dict[str, Any]:
        return {**self.base, **self.load, "lastUpdate": int(time.time() * 1000)}

    def register(self) -> None:
        with self._lock:
            self._version = self.brokers_res.register(self.broker_id, self._data())
        log.info("registered broker %s", self.broker_id)

    def report(self, load: dict[str, Any]) -> None:
        """Write the load report (registering again when the key was lost with the session)."""
        with self._lock:
            if self.closed:
                return
            self.load = load
            version = None
            if self._version is not None:
                version = self.brokers_res.report(self.broker_id, self._data(), self._version)
            if version is None:
                version = self.brokers_res.register(self.broker_id, self._data())
            self._version = version

    def brokers(self, cluster_name: str) -> dict[str, dict[str, Any]]:
        """The live brokers of ``cluster_name``: id -> their data."""
        return {
            bid: data
            for bid, data in self.brokers_res.brokers().items()
            if data.get("clusterName", cluster_name) == cluster_name
        }

    # --- leader --------------------------------------------------------------------------------

    def leader_data(self) -> dict[str, Any]:
        return {"brokerId": self.broker_id, "serviceUrl": self.base.get("webServiceUrl") or ""}

    def elect(self) -> None:
        """Run for leader (again); watch the key so that its deletion starts a new round."""
        if self.closed:
            return
        try:
            data, mine = self.leader_res.try_lead(self.leader_data())
        except MetadataStoreError:
            log.warning("leader election failed; trying again when the leader key changes", exc_info=True)
            return
        self.is_leader = mine
        self.leader_id = str(data.get("brokerId") or "") or None
        if mine:
            log.info("broker %s is the leader", self.broker_id)
        if self._watch is None:
            self._watch = self.leader_res.watch(self._leader_changed)

    def _leader_changed(self, notification: Any) -> None:
        if notification.type in (NotificationType.DELETED, NotificationType.CREATED):
            if notification.type is NotificationType.DELETED:
                self.is_leader = False
                self.leader_id = None
            self.elect()

    def current_leader(self) -> tuple[str, bool] | None:
        """(leader id, whether it is this broker), read from the store."""
        got = self.leader_res.leader()
        if got is None:
            return None
        data, mine = got
        self.is_leader = mine
        self.leader_id = str(data.get("brokerId") or "") or None
        return (self.leader_id or "", mine)

    def close(self) -> None:
        """Resign and unregister (both ephemeral keys also vanish with the session)."""
        with self._lock:
            self.closed = True
        if self._watch is not None:
            self._watch.cancel()
        try:
            self.leader_res.resign()
            self.brokers_res.unregister(self.broker_id)
        except MetadataStoreError:
            log.warning("could not remove broker %s from the store; its session's end will", self.broker_id)
