"""The cluster service of one broker: which bundles it owns, lookups, assignment, unload.

Lookup (binary ``LOOKUP``, HTTP ``/lookup/v2``, the admin API's 307), with Pulsar's rules:

1. The bundle of the topic (``bundles``) is owned by this broker: ``Connect`` here (no store
   access: the owned set is in memory, so a lookup costs what it costs on one broker).
2. Someone owns it (``/namespace/{t}/{ns}/{range}``): ``Connect`` to the owner's URLs, as Pulsar
   answers; the client connects there directly. The owner read is kept until a watch on the key
   reports a change (it is watched before it is read, so no change can slip in between).
3. Nobody owns it, and the request is ``authoritative`` (a leader sent the client here): this
   broker takes it (ephemeral create; if another broker won the race, case 2).
4. Nobody owns it, this broker is not the leader and a leader is registered: ``Redirect`` to the
   leader, ``authoritative=false``.
5. Nobody owns it and this broker leads (or there is no leader, or ``loadBalancerEnabled`` is
   false: then this broker takes it at once): the least-loaded broker is chosen -- the one owning
   the fewest bundles, then the fewest loaded topics, then the smallest id, counting bundles the
   leader assigned moments ago that no report shows yet. Itself: take the bundle, ``Connect``.
   Another broker: ``Redirect`` there with ``authoritative=true``, and that broker takes it (3).
   An unload may leave a hint: the next assignment goes to its ``destinationBroker``, or avoids
   the ``previousOwner`` when another broker is live.

A producer or consumer on a topic whose bundle this broker does not own is refused with
``ServiceNotReady`` (``check_topic_owned``, called where a topic loads); the client looks up again.

A lookup does not refuse a bundle in flux at once: it waits out the handoff a little
(``settle``: ``settled_decision``, ``joined_cluster``).

Unloading a bundle (admin call, graceful shutdown) marks it not owned, closes its loaded topics
(clients are told to reconnect and look up again) and deletes the ownership key. When the store
session is lost (the broker was cut off or paused past the session timeout) every bundle is gone
at once: the broker closes all their topics without touching the store.

Fencing (``storage.resources.fence``): taking a bundle bumps its epoch counter in the same commit
that creates the owner key; the bundle's ``Fence`` (the owner key at its version, the counter at
its version) is kept in ``fences`` and handed to storage through ``fence_for(topic)``, so every
commit of a topic's ledger list or cursors, and every flush of its ledger objects, fails once
this broker's ownership of the bundle ended -- whether or not the broker has noticed yet.

A bundle is in ``owned`` only while its fence can hold; three rules keep it so:

* Sessions are counted (``_generation``, +1 at each lost session, on the store's thread before
  anything else): a lookup that takes a bundle remembers the count it started under, and if a
  session was lost before it could record the bundle (the lock was won, or its fence read,
  under a session that is over) it records nothing, releases the key if this session holds it
  and answers ``ServiceNotReady`` (the client looks up again). A lost session drops only the
  bundles won before it (``_won_under``), never one taken again under the new session.
* A bundle being given up (``_leaving``: an unload, or the rule below) is not taken again by a
  lookup until its key is gone: else the lookup would record the key about to be deleted.
* A fence the store finds over (``Fence.when_over``: a commit or lease check failed on it) while
  it is the bundle's current one makes the broker give the bundle up (close its topics, forget
  it, release the key if still this session's): the next lookup takes it again under a new
  epoch, rather than every commit failing with "ownership epoch N is over" for ever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ...errors import InvalidConfiguration, ServerError, ServiceNotReady
from ...naming import TopicName
from ...storage.metadata_store import MetadataStoreError, SessionEvent
from ...storage.resources.fence import Fence, Fenced, lost_fence
from .bundles import Bundle, all_bundles, bundle_of, stored_boundaries
from .membership import Membership, broker_id_of, registration_data
from .settle import joined_cluster, settled_decision

if TYPE_CHECKING:  # pragma: no cover
    from ..lookup import LookupAnswer
    from ..server import BrokerService

log = logging.getLogger(__name__)

#: seconds an assignment made by the leader counts toward its broker before a report shows it
PENDING_ASSIGNMENT_SECONDS = 30.0


@dataclass(frozen=True)
class Decision:
    """Where a lookup goes: ``own`` (this broker serves it), or ``target`` URLs (a
    ``NamespaceEphemeralData`` or a broker's ``LocalBrokerData``) with ``redirect`` and
    ``authoritative`` as the client must get them."""

    own: bool
    target: dict[str, Any] | None = None
    redirect: bool = False
    authoritative: bool = True
    acquired: Bundle | None = None


class ClusterService:
    def __init__(self, service: "BrokerService") -> None:
        self.service = service
        config = service.config
        self.cluster_name = str(config["clusterName"])
        self.num_bundles = int(config["defaultNumberOfNamespaceBundles"])
        self.balancer = bool(config["loadBalancerEnabled"])
        self.report_interval = max(100, int(config["loadBalancerReportUpdateMinIntervalMillis"])) / 1000
        self.resources = service.storage.resources
        self.store = service.storage.metadata_store
        try:
            self.broker_id = broker_id_of(service.web_url or "", service.web_url_tls)
        except ValueError as exc:  # a broker with no web port cannot be named in the cluster
            raise InvalidConfiguration(str(exc)) from None
        self.membership = Membership(
            self.resources, self.broker_id, registration_data(service, self.cluster_name)
        )
        self.owned: set[Bundle] = set()
        self.fences: dict[Bundle, Fence] = {}  # of the owned bundles
        self._generation = 0  # lost sessions so far (the module docstring)
        self._won_under: dict[Bundle, int] = {}  # owned bundle -> _generation it was taken under
        self._leaving: set[Bundle] = set()  # being given up: not taken again until the key is gone
        self._boundaries: dict[str, list[int]] = {}
        self._pending: dict[str, dict[Bundle, float]] = {}  # leader: broker -> bundle -> when
        # owners of bundles other brokers hold, kept until a watch says the key changed
        self._owners: dict[Bundle, dict[str, Any]] = {}
        self._owner_watches: dict[Bundle, Any] = {}
        self._owner_generation: dict[Bundle, int] = {}
        self._wake = asyncio.Event()
        self._force_report = False
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closing = False
        self.joined = False  # start() done: this broker may own bundles

    # --- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.service.storage.object_store is None:
            log.warning(
                "cluster mode without objectLedgerStorageUrl: topic data stays on this broker's "
                "disk and does NOT follow ownership (a topic that moves loses its earlier entries "
                "on the new owner); set objectLedgerStorageUrl to an object store all brokers share"
            )
        self.service.storage.fence_provider = self.fence_for
        await self.service.run_blocking(self.membership.register)
        await self.service.run_blocking(self.membership.elect)
        self.store.register_session_listener(self._session_event)
        self._task = self.service.state.spawn(self._report_loop())
        self.joined = True

    async def release_all(self) -> None:
        """Graceful shutdown: leave the cluster (so no bundle is assigned here), then unload
        every owned bundle so its clients move to other brokers."""
        if self.closing:
            return
        self.closing = True
        await self.service.run_blocking(self.membership.close)
        for watch in list(self._owner_watches.values()):
            watch.cancel()
        for bundle in sorted(self.owned):
            try:
                await self.unload_bundle(bundle)
            except Exception:  # noqa: BLE001 - the key goes with the session anyway
                log.exception("unloading bundle %s at shutdown failed", bundle)
        if self._task is not None:
            self._task.cancel()

    def _session_event(self, event: SessionEvent) -> None:
        """Store notification thread: a lost session took every ephemeral key with it."""
        loop = self._loop
        if loop is None or self.closing:
            return
        if event is SessionEvent.SESSION_LOST:
            self._generation += 1  # first: a lookup taking a bundle now records nothing
            generation = self._generation
            try:  # at once, on this thread: no lease lets an entry through meanwhile (only those
                # won before: one recorded under the new session must not stay owned but revoked)
                for bundle, fence in list(self.fences.items()):
                    if self._won_under.get(bundle, 0) < generation:
                        fence.revoke()
            except RuntimeError:  # the dict changed while read: _ownership_lost revokes them
                pass
            loop.call_soon_threadsafe(lambda: self.service.state.spawn(self._ownership_lost(generation)))
        elif event is SessionEvent.SESSION_REESTABLISHED:
            self._force_report = True  # the report loop registers again, load changed or not
            loop.call_soon_threadsafe(self._wake.set)
            try:
                self.membership.elect()
            except Exception:  # noqa: BLE001
                log.exception("leader election after a new session failed")

    async def _ownership_lost(self, generation: int) -> None:
        """The session counted ``generation`` was lost: every bundle taken before it is gone."""
        lost = [b for b in self.owned if self._won_under.get(b, 0) < generation]
        for bundle in lost:
            self._forget(bundle)
        self._owners.clear()  # a watch may have missed changes while the session was gone
        log.warning("metadata store session lost: %d bundle(s) are no longer owned here", len(lost))
        for bundle in lost:
            await self._close_topics(bundle)

    def _forget(self, bundle: Bundle) -> Fence | None:
        """No longer owned here; its fence revoked (no lease of it lets another entry through)."""
        self.owned.discard(bundle)
        self._won_under.pop(bundle, None)
        fence = self.fences.pop(bundle, None)
        if fence is not None:
            fence.revoke()
        return fence

    async def _report_loop(self) -> None:
        last: dict[str, Any] | None = None
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.report_interval)
            except asyncio.TimeoutError:
                pass
            if self.closing:
                # ends by itself: release_all's cancel can be lost (Python 3.11's wait_for
                # returns the wake-up its unloads set instead of raising the cancel), and the
                # shutdown then waited its 2 s for this task on every graceful stop
                return
            self._wake.clear()
            load = self._load()
            if (load == last and not self._force_report) or self.membership.closed:
                continue
            self._force_report = False
            try:
                await self.service.run_blocking(self.membership.report, load)
                last = load
            except MetadataStoreError:
                self._force_report = True
                log.warning("writing the load report failed; trying again", exc_info=True)

    def _load(self) -> dict[str, Any]:
        bundles = sorted(str(b) for b in self.owned)
        return {"numBundles": len(bundles), "bundles": bundles, "numTopics": len(self.service.topics.loaded)}

    # --- bundles -----------------------------------------------------------------------------

    async def boundaries(self, namespace: str) -> list[int]:
        cached = self._boundaries.get(namespace)
        if cached is None:
            cached = await self.service.run_blocking(
                stored_boundaries, self.resources.namespaces, namespace, self.num_bundles
            )
            self._boundaries[namespace] = cached
        return cached

    async def bundle_of_topic(self, tn: TopicName) -> Bundle:
        ns = tn.namespace_name
        return bundle_of(ns, await self.boundaries(ns), str(tn))

    async def bundles(self, namespace: str) -> list[Bundle]:
        return all_bundles(namespace, await self.boundaries(namespace))

    async def owns(self, tn: TopicName) -> bool:
        return await self.bundle_of_topic(tn) in self.owned

    def leaving(self, bundle: Bundle) -> bool:
        """Whether ``bundle`` is being given up here (its key not yet gone)."""
        return bundle in self._leaving

    # --- lookup ------------------------------------------------------------------------------

    async def decide(self, tn: TopicName, authoritative: bool) -> Decision:
        bundle = await self.bundle_of_topic(tn)
        if bundle in self.owned:
            return Decision(own=True)
        if self.closing:
            raise ServiceNotReady(f"broker {self.broker_id} is shutting down; look up {tn} again")
        if bundle in self._leaving:
            raise ServiceNotReady(f"bundle {bundle} is being unloaded; look up {tn} again")
        cached = self._owners.get(bundle)
        if cached is not None:  # owned elsewhere, and no change seen since it was read
            return Decision(own=False, target=cached)
        generation = self._generation
        decision = await self.service.run_blocking(self._resolve, bundle, authoritative)
        if decision.acquired is not None:
            fence = await self.service.run_blocking(
                self.resources.ownership.fence, bundle.namespace, bundle.range
            )
            if fence is None:  # lost again meanwhile (session expired): look up again
                raise ServiceNotReady(f"bundle {bundle} changed owner during the lookup; look up {tn} again")
            await self._record(bundle, fence, generation, tn)
        return decision

    async def _record(self, bundle: Bundle, fence: Fence, generation: int, tn: TopicName) -> None:
        """Own ``bundle`` under ``fence``, taken by a lookup that started at ``generation`` --
        unless a session was lost meanwhile or the bundle is being given up (module docstring)."""
        if generation != self._generation or bundle in self._leaving or self.closing:
            fence.revoke()
            if (generation != self._generation or self.closing) and bundle not in self.owned:
                # won under a session that is over, or under the new one by a lookup that cannot
                # tell, or while shutting down: give the key back (if this session holds it)
                await self.service.run_blocking(
                    self.resources.ownership.release, bundle.namespace, bundle.range
                )
            log.info(
                "broker %s: bundle %s taken while its session or ownership ended; dropped",
                self.broker_id,
                bundle,
            )
            raise ServiceNotReady(f"bundle {bundle} changed owner during the lookup; look up {tn} again")
        current = self.fences.get(bundle)
        if bundle in self.owned and current is not None and current.checks == fence.checks:
            return  # a concurrent lookup recorded this same ownership: keep its fence
        if current is not None:
            current.revoke()
        fence.when_over(lambda: self._fence_over(bundle, fence))
        self.fences[bundle] = fence
        self._won_under[bundle] = generation
        self.owned.add(bundle)
        self._wake.set()
        log.info("broker %s owns bundle %s (epoch %d)", self.broker_id, bundle, fence.epoch)
        self.service.state.spawn(self._load_topics(bundle))

    def _fence_over(self, bundle: Bundle, fence: Fence) -> None:
        """Any thread: the store found ``fence`` over (``Fence.when_over``)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(lambda: self.service.state.spawn(self._drop_ended(bundle, fence)))

    async def _drop_ended(self, bundle: Bundle, fence: Fence) -> None:
        """Give ``bundle`` up when ``fence``, found over by the store, is still its current one."""
        if bundle in self._leaving:
            return
        if self.fences.get(bundle) is not fence or bundle not in self.owned:
            await self._close_bound_to(fence)  # an older ownership's: its topics reopen under the current
            return
        log.warning(
            "broker %s: ownership epoch %d of bundle %s is over in the store; giving the bundle up",
            self.broker_id,
            fence.epoch,
            bundle,
        )
        self._leaving.add(bundle)
        try:
            self._forget(bundle)
            await self._close_topics(bundle)
            await self.service.run_blocking(self.resources.ownership.release, bundle.namespace, bundle.range)
        finally:
            self._leaving.discard(bundle)
        self._wake.set()

    async def lookup(
        self,
        tn: TopicName,
        listener: str | None,
        authoritative: bool,
        check: Callable[[], Awaitable[Any]] | None = None,
    ) -> "LookupAnswer":
        from ..lookup import answer_from_data, own_answer

        decision = await settled_decision(self, tn, authoritative, check)
        if decision.own or decision.target is None:
            return own_answer(self.service, listener)
        return answer_from_data(decision.target, listener, decision.redirect, decision.authoritative)

    def _resolve(self, bundle: Bundle, authoritative: bool) -> Decision:
        """Blocking: the owner, or an assignment (the module docstring's cases 2-5)."""
        generation = self._watch_owner(bundle)
        found = self.resources.ownership.owner(bundle.namespace, bundle.range)
        if found is not None:
            data, mine = found
            if mine:
                return Decision(own=True, acquired=bundle)
            if self._owner_generation.get(bundle) == generation:  # no change while it was read
                self._owners[bundle] = data
            return Decision(own=False, target=data)
        if authoritative or not self.balancer:
            return self._acquire(bundle)
        leader = self.membership.current_leader()
        if leader is None and not self.membership.closed:
            self.membership.elect()
            leader = self.membership.current_leader()
        brokers = self.membership.brokers(self.cluster_name)
        if leader is not None and not leader[1] and leader[0] in brokers:
            return Decision(own=False, target=brokers[leader[0]], redirect=True, authoritative=False)
        chosen = self._choose(bundle, brokers)
        if chosen is None or chosen == self.broker_id:
            return self._acquire(bundle)
        self._pending.setdefault(chosen, {})[bundle] = time.monotonic()
        return Decision(own=False, target=brokers[chosen], redirect=True, authoritative=True)

    def _watch_owner(self, bundle: Bundle) -> int:
        """Blocking: watch the bundle's owner key (once per bundle) before it is read, so that a
        change after the read always drops the cached owner. Returns the change count seen."""
        if bundle not in self._owner_watches:
            self._owner_generation.setdefault(bundle, 0)

            def changed(_notification: Any) -> None:
                self._owner_generation[bundle] = self._owner_generation.get(bundle, 0) + 1
                self._owners.pop(bundle, None)

            self._owner_watches[bundle] = self.resources.ownership.watch(
                bundle.namespace, bundle.range, changed
            )
        return self._owner_generation.get(bundle, 0)

    def _acquire(self, bundle: Bundle) -> Decision:
        data, mine = self.resources.ownership.try_acquire(
            bundle.namespace, bundle.range, self._ownership_data()
        )
        return Decision(own=True, acquired=bundle) if mine else Decision(own=False, target=data)

    def _ownership_data(self) -> dict[str, Any]:
        """Pulsar's ``NamespaceEphemeralData`` of this broker."""
        base = self.membership.base
        return {
            "nativeUrl": base["pulsarServiceUrl"],
            "nativeUrlTls": base["pulsarServiceUrlTls"],
            "httpUrl": base["webServiceUrl"],
            "httpUrlTls": base["webServiceUrlTls"],
            "disabled": False,
            "advertisedListeners": base["advertisedListeners"],
        }

    def _choose(self, bundle: Bundle, brokers: dict[str, dict[str, Any]]) -> str | None:
        """The least-loaded live broker for ``bundle`` (module docstring, case 5)."""
        if not brokers:
            return None
        hint = self.resources.unload_hints.take(bundle.namespace, bundle.range) or {}
        destination = hint.get("destinationBroker")
        if destination in brokers:
            return str(destination)
        candidates = [b for b in brokers if b != hint.get("previousOwner")] or list(brokers)
        reported = {name for data in brokers.values() for name in data.get("bundles") or ()}
        now = time.monotonic()

        def load(broker: str) -> tuple[int, int, str]:
            pending = self._pending.get(broker, {})
            for b, when in list(pending.items()):
                if str(b) in reported or now - when > PENDING_ASSIGNMENT_SECONDS:
                    pending.pop(b, None)
            data = brokers[broker]
            return (int(data.get("numBundles") or 0) + len(pending), int(data.get("numTopics") or 0), broker)

        return min(candidates, key=load)

    # --- unload ------------------------------------------------------------------------------

    async def unload_bundle(self, bundle: Bundle, destination: str | None = None) -> bool:
        """Give up an owned bundle (False: not owned here, nothing done)."""
        if bundle not in self.owned or bundle in self._leaving:
            return False
        self._leaving.add(bundle)  # no lookup takes it again until its key is gone
        try:
            self.owned.discard(bundle)  # from now on its topics refuse to load here
            fence = self.fences.get(bundle)  # open topics keep committing under it until they close
            hint = {"previousOwner": self.broker_id, "destinationBroker": destination}
            try:
                await self.service.run_blocking(
                    self.resources.unload_hints.put, bundle.namespace, bundle.range, hint
                )
            except MetadataStoreError:
                log.warning("could not store the unload hint of %s", bundle, exc_info=True)
            await self._close_topics(bundle)
            if fence is not None:
                fence.revoke()  # before the key goes: nothing of this ownership is acknowledged after
            await self.service.run_blocking(self.resources.ownership.release, bundle.namespace, bundle.range)
            if self.fences.get(bundle) is fence:
                self.fences.pop(bundle, None)
                self._won_under.pop(bundle, None)
        finally:
            self._leaving.discard(bundle)
        self._wake.set()
        log.info("broker %s unloaded bundle %s", self.broker_id, bundle)
        return True

    async def _load_topics(self, bundle: Bundle) -> None:
        """A bundle just taken: open its persistent topics now (as Pulsar's
        ``loadNamespaceTopics``), each recovered from the metadata and object stores alone, so
        that clients coming over from the last owner find them ready and compaction goes on."""
        topics = self.service.topics
        try:
            names = await self.service.run_blocking(topics.metadata.topics, bundle.namespace)
            boundaries = await self.boundaries(bundle.namespace)
        except Exception:  # noqa: BLE001 - clients still load each topic on first use
            log.warning("listing the topics of bundle %s failed", bundle, exc_info=True)
            return
        for name in names:
            if bundle not in self.owned or self.closing:
                return
            if bundle_of(bundle.namespace, boundaries, name) != bundle or name in topics.loaded:
                continue
            try:
                await topics.get_topic(name, create=False)
            except Exception as exc:  # noqa: BLE001 - one topic does not keep the others unloaded
                log.warning("loading %s after taking bundle %s failed: %s", name, bundle, exc)

    async def _close_topics(self, bundle: Bundle) -> None:
        """Unload the bundle's loaded topics -- but not those opened under a newer ownership of
        it (a lost session's clean-up that runs after the bundle was taken again)."""
        topics = self.service.topics
        boundaries = await self.boundaries(bundle.namespace)
        current = self.fences.get(bundle) if bundle in self.owned else None
        for name, topic in list(topics.loaded.items()):
            tn = topic.topic_name
            if current is not None and self.service.storage.fence_for(name) is current:
                continue
            if (
                tn.namespace_name == bundle.namespace
                and bundle_of(tn.namespace_name, boundaries, name) == bundle
            ):
                await self._unload_quietly(name)

    async def _unload_quietly(self, name: str) -> None:
        """Unload one topic of a bundle given up; its close committing under the ended fence
        (``Fenced``: the ownership is over, the next owner's recovery seals its ledger) or
        without the store is one line, not a traceback -- it is the expected end of a lost
        session. Anything else is logged whole; one topic never keeps the others loaded."""
        try:
            await self.service.topics.unload(name, close_ledger=True)
        except (Fenced, MetadataStoreError) as e:
            log.warning(
                "unloading %s: its ledger was not sealed here (the next owner recovers it): %s", name, e
            )
        except Exception:  # noqa: BLE001 - one topic does not keep the others loaded
            log.exception("unloading %s failed", name)

    async def _close_bound_to(self, fence: Fence) -> None:
        """Unload the loaded topics whose ledgers commit under ``fence`` (an ownership that is
        over): a consumer-only topic would otherwise fail its acknowledgements for ever."""
        topics, storage = self.service.topics, self.service.storage
        for name in list(topics.loaded):
            if storage.fence_for(name) is fence:
                await self._unload_quietly(name)

    def fence_for(self, topic: str) -> Fence:
        """The fence of ``topic``'s bundle while this broker owns it; a lost fence otherwise
        (blocking: storage threads call it; ``storage.resources.fence``)."""
        tn = TopicName.parse(topic)
        ns = tn.namespace_name
        bounds = self._boundaries.get(ns)
        if bounds is None:
            bounds = stored_boundaries(self.resources.namespaces, ns, self.num_bundles)
        bundle = bundle_of(ns, bounds, str(tn))
        fence = self.fences.get(bundle)
        return fence if fence is not None and bundle in self.owned else lost_fence(f"topic {tn}")

    async def owner_of(self, bundle: Bundle) -> dict[str, Any] | None:
        """The owner's ``NamespaceEphemeralData`` (None: unowned)."""
        found = await self.service.run_blocking(
            self.resources.ownership.owner, bundle.namespace, bundle.range
        )
        return None if found is None else found[0]


async def check_topic_owned(service: "BrokerService", tn: TopicName) -> None:
    """``ServiceNotReady`` unless this broker owns the bundle of ``tn`` (no-op on one broker;
    waits for the join on a broker that has not joined its cluster yet: ``joined_cluster``)."""
    cluster = await joined_cluster(service)
    if cluster is None or await cluster.owns(tn):
        return
    raise ServiceNotReady(
        f"Namespace bundle for topic ({tn}) not served by this instance: {cluster.broker_id}. "
        f"Please redo the lookup. Request is denied: namespace={tn.namespace_name}"
    )


def check_opened_under_current_ownership(service: "BrokerService", tn: TopicName) -> None:
    """``ServiceNotReady`` when ``tn``'s managed ledger was opened under an ownership of its
    bundle that ended while the topic loaded (the bundle was given up and taken again
    meanwhile): a topic kept so would commit under a revoked fence (no-op on one broker)."""
    cluster = service.cluster
    if cluster is None or service.storage.fence_for(str(tn)) is cluster.fence_for(str(tn)):
        return
    raise ServiceNotReady(f"the ownership of {tn}'s bundle changed while it loaded; look it up again")


def load_failed_on_lost_ownership(service: "BrokerService", tn: TopicName, exc: BaseException) -> bool:
    """Whether a failed load of ``tn`` failed because this broker's hold on it ended or its
    metadata store was away -- a retriable condition (the client looks up again and finds the
    owner, or this broker once its store is back) even when a storage layer wrapped it in a
    ``StorageError`` (PersistenceError on the wire, which the client does not retry): a
    retriable store error (``Fenced``, ``StoreUnavailable``) anywhere in the exception's
    causes, or, in a cluster, the bundle no longer owned here, the ledger's fence over or the
    store disconnected. A disk error or a damaged ledger on a broker that still owns the topic
    is neither: it stays what it is."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if getattr(cause, "server_error", None) is ServerError.ServiceNotReady:
            return True
        cause = cause.__cause__ or cause.__context__
    cluster = service.cluster
    if cluster is None:
        return False
    if not cluster.store.connected or cluster.closing:
        return True
    fence = service.storage.fence_for(str(tn))
    current = cluster.fence_for(str(tn))
    return current.lost or current.revoked or fence.lost or fence.revoked or fence is not current
