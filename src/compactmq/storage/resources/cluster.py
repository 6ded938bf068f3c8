"""Cluster resources: broker registrations, load reports, the leader, bundle ownership (Pulsar's paths).

Brokers that share one metadata store (ZooKeeper) coordinate through four kinds of keys, all
written here and nowhere else:

==========================================  ==========================================================
``/loadbalance/brokers/{host:webport}``     ephemeral: a live broker, its URLs and its load report
                                            (Pulsar's ``LocalBrokerData`` field names)
``/loadbalance/leader``                     ephemeral: the broker that assigns unowned bundles
                                            (Pulsar's ``LeaderBroker``: ``brokerId``, ``serviceUrl``)
``/namespace/{tenant}/{ns}/{0x.._0x..}``    ephemeral: the owner of one bundle (Pulsar's
                                            ``NamespaceEphemeralData``: ``nativeUrl``, ``httpUrl``...)
``/loadbalance/unload-hints/{t}/{ns}/{r}``  persistent, short-lived: where an unloaded bundle should go
                                            next (``destinationBroker``) or not go (``previousOwner``)
``/loadbalance/bundle-epochs/{t}/{ns}/{r}`` persistent: its version counts the bundle's ownerships;
                                            bumped in the commit that creates the owner key
                                            (compactmq's own: the epoch that fences, ``fence``)
==========================================  ==========================================================

Ephemeral keys belong to the writer's store session: a broker that dies (or is cut off past
``metadataStoreSessionTimeoutMillis``) loses its registration, its leadership and its bundles
at once, with no action of its own. Taking a bundle or the leadership is a create with
``expected_version=NEW``: exactly one broker wins, the others read the winner.
"""

from __future__ import annotations

from typing import Callable

from ..metadata_store import NEW, BadVersion, Check, KeyNotFound, Notification, Put, Watch
from .base import BaseResources, Json, decode_segment, dumps, encode_segment, loads
from .fence import Fence

BROKERS_ROOT = "/loadbalance/brokers"
LEADER_PATH = "/loadbalance/leader"
OWNERSHIP_ROOT = "/namespace"
HINTS_ROOT = "/loadbalance/unload-hints"
EPOCHS_ROOT = "/loadbalance/bundle-epochs"


def _bundle_suffix(namespace: str, bundle_range: str) -> str:
    tenant, _, name = namespace.partition("/")
    return f"{encode_segment(tenant)}/{encode_segment(name)}/{encode_segment(bundle_range)}"


class BrokerRegistry(BaseResources):
    """``/loadbalance/brokers``: one ephemeral key per live broker."""

    def _path(self, broker_id: str) -> str:
        return f"{BROKERS_ROOT}/{encode_segment(broker_id)}"

    def register(self, broker_id: str, data: Json) -> int:
        """Create this broker's key (ephemeral); a key left by an earlier run of the same
        ``host:port`` (killed, its session not yet expired) is replaced: that process is gone,
        since this one holds its port. Returns the key's version."""
        path = self._path(broker_id)
        for _ in range(3):
            try:
                return self.store.put(path, dumps(data), NEW, ephemeral=True).version
            except BadVersion:
                got = self.store.get(path)
                if got is not None and got.stat.created_by_self:
                    return self.store.put(path, dumps(data), got.stat.version).version
                try:
                    self.store.delete(path, got.stat.version if got is not None else None)
                except (BadVersion, KeyNotFound):
                    pass
        raise BadVersion(f"broker {broker_id} could not register: its key keeps changing")

    def report(self, broker_id: str, data: Json, version: int) -> int | None:
        """Replace this broker's report; None when its key is gone or not at ``version`` (the
        session was lost: register again)."""
        try:
            return self.store.put(self._path(broker_id), dumps(data), version).version
        except BadVersion:
            return None

    def unregister(self, broker_id: str) -> None:
        got = self.store.get(self._path(broker_id))
        if got is not None and got.stat.created_by_self:
            try:
                self.store.delete(self._path(broker_id), got.stat.version)
            except (BadVersion, KeyNotFound):
                pass

    def brokers(self) -> dict[str, Json]:
        """Every registered broker: ``host:webport`` -> its data (a key that vanished while being
        read is left out)."""
        out: dict[str, Json] = {}
        for child in self.store.get_children(BROKERS_ROOT):
            path = f"{BROKERS_ROOT}/{child}"
            got = self.store.get(path)
            if got is not None:
                out[decode_segment(child)] = loads(got.value, path)
        return out

    def watch(self, callback: Callable[[Notification], None]) -> Watch:
        return self.store.watch(BROKERS_ROOT, callback)


class LeaderElection(BaseResources):
    """``/loadbalance/leader``: whoever created it leads until its session ends."""

    def try_lead(self, data: Json) -> tuple[Json, bool]:
        """(the leader's data, whether it is this store's session)."""
        for _ in range(5):
            try:
                self.store.put(LEADER_PATH, dumps(data), NEW, ephemeral=True)
                return data, True
            except BadVersion:
                got = self.store.get(LEADER_PATH)
                if got is not None:
                    return loads(got.value, LEADER_PATH), got.stat.created_by_self
        raise BadVersion("the leader key keeps changing")

    def leader(self) -> tuple[Json, bool] | None:
        got = self.store.get(LEADER_PATH)
        return None if got is None else (loads(got.value, LEADER_PATH), got.stat.created_by_self)

    def resign(self) -> None:
        got = self.store.get(LEADER_PATH)
        if got is not None and got.stat.created_by_self:
            try:
                self.store.delete(LEADER_PATH, got.stat.version)
            except (BadVersion, KeyNotFound):
                pass

    def watch(self, callback: Callable[[Notification], None]) -> Watch:
        return self.store.watch(LEADER_PATH, callback)


class OwnershipResources(BaseResources):
    """``/namespace/{tenant}/{ns}/{range}``: the ephemeral owner of each bundle."""

    def _path(self, namespace: str, bundle_range: str) -> str:
        return f"{OWNERSHIP_ROOT}/{_bundle_suffix(namespace, bundle_range)}"

    def owner(self, namespace: str, bundle_range: str) -> tuple[Json, bool] | None:
        """(the owner's ``NamespaceEphemeralData``, whether this session owns it), or None."""
        path = self._path(namespace, bundle_range)
        got = self.store.get(path)
        return None if got is None else (loads(got.value, path), got.stat.created_by_self)

    def try_acquire(self, namespace: str, bundle_range: str, data: Json) -> tuple[Json, bool]:
        """Take the bundle unless someone holds it: (the owner's data, whether it is this session)."""
        path = self._path(namespace, bundle_range)
        epochs = self._epoch_path(namespace, bundle_range)
        for _ in range(5):
            counter = self.store.get(epochs)
            version = NEW if counter is None else counter.stat.version
            try:  # the owner key and the next epoch, in one commit (the fence module's rule)
                self.store.commit(
                    [
                        Put(path, dumps(data), NEW, ephemeral=True),
                        Put(epochs, dumps({"owner": data}), version),
                    ]
                )
                return data, True
            except BadVersion:
                got = self.store.get(path)
                if got is not None:
                    return loads(got.value, path), got.stat.created_by_self
        raise BadVersion(f"the owner of bundle {namespace}/{bundle_range} keeps changing")

    def _epoch_path(self, namespace: str, bundle_range: str) -> str:
        return f"{EPOCHS_ROOT}/{_bundle_suffix(namespace, bundle_range)}"

    def fence(self, namespace: str, bundle_range: str) -> Fence | None:
        """The fence of this session's ownership of the bundle (None: not this session's).

        The counter is read BEFORE the owner key: no other broker can bump the counter while a
        key of this session is there, so the version read is this ownership's (or, if this
        session created the key only after the read, an older one: a fence that fails and is
        given up, never one that holds for someone else). Read the other way round, a session that expired between the reads (and a new session of
        this broker reading on) could pair its own old key's check (version 0, which the next
        owner's key also has) with the NEXT owner's counter: a fence that holds under another
        broker's ownership."""
        path = self._path(namespace, bundle_range)
        counter = self.store.get(self._epoch_path(namespace, bundle_range))
        got = self.store.get(path)
        if got is None or not got.stat.created_by_self:
            return None
        if counter is None:  # taken before epochs existed: start one under this ownership
            counter_version = self.store.put(self._epoch_path(namespace, bundle_range), b"{}").version
        else:
            counter_version = counter.stat.version
        checks = (
            Check(path, got.stat.version),
            Check(self._epoch_path(namespace, bundle_range), counter_version),
        )
        return Fence(checks, counter_version + 1, what=f"bundle {namespace}/{bundle_range}")

    def release(self, namespace: str, bundle_range: str) -> bool:
        """Delete the ownership key when this session holds it; whether it did."""
        path = self._path(namespace, bundle_range)
        got = self.store.get(path)
        if got is None or not got.stat.created_by_self:
            return False
        try:
            self.store.delete(path, got.stat.version)
        except (BadVersion, KeyNotFound):
            return False
        return True

    def watch(self, namespace: str, bundle_range: str, callback: Callable[[Notification], None]) -> Watch:
        """Call ``callback`` whenever the bundle's owner key is created, changed or deleted."""
        return self.store.watch(self._path(namespace, bundle_range), callback)

    def owned_ranges(self, namespace: str) -> dict[str, Json]:
        """range -> owner data, for every owned bundle of ``namespace``."""
        tenant, _, name = namespace.partition("/")
        parent = f"{OWNERSHIP_ROOT}/{encode_segment(tenant)}/{encode_segment(name)}"
        out: dict[str, Json] = {}
        for child in self.store.get_children(parent):
            got = self.store.get(f"{parent}/{child}")
            if got is not None:
                out[decode_segment(child)] = loads(got.value, parent)
        return out


class UnloadHints(BaseResources):
    """``/loadbalance/unload-hints/...``: what an unload asked of the bundle's next assignment."""

    def _path(self, namespace: str, bundle_range: str) -> str:
        return f"{HINTS_ROOT}/{_bundle_suffix(namespace, bundle_range)}"

    def put(self, namespace: str, bundle_range: str, hint: Json) -> None:
        self.store.put(self._path(namespace, bundle_range), dumps(hint))

    def take(self, namespace: str, bundle_range: str) -> Json | None:
        """The hint, deleted as it is read (None: no hint)."""
        path = self._path(namespace, bundle_range)
        got = self.store.get(path)
        if got is None:
            return None
        try:
            self.store.delete(path, got.stat.version)
        except (BadVersion, KeyNotFound):
            return None  # another leader took it
        return loads(got.value, path)
