"""The broker process: one ``BrokerService`` (state shared by every connection) and one
``BrokerServer`` (sockets and the shutdown order).

``ServerState`` registers every connection and every background task, so shutdown finds them.
Shutdown runs in a fixed order (``BrokerServer.shutdown``):

1. stop accepting connections (binary port, then the web port); in a cluster, leave it and
   unload every owned bundle (``broker.cluster``);
2. close producers and consumers with CLOSE_PRODUCER / CLOSE_CONSUMER, so clients reconnect
   to whoever serves the topic next, and persist what producers already sent;
3. flush acknowledgements to the cursors; stop the housekeeping timer;
4. close the connections, finish in-flight tasks (bounded wait), stop compactions;
5. close storage (seals ledgers, closes the metadata store), stop the thread pool.

Storage is synchronous: every call goes through ``run_blocking`` (a thread pool executor),
never on the event loop.

The entry point (``cli/standalone.build_server``) builds what the broker is made of and hands
it in: the opened storage, the authentication and the adapters' post-compaction hooks to
``BrokerService``; the service, the TLS context and the web service to ``BrokerServer``. The web
service (admin REST API and /metrics) is an adapter one layer up, so the broker never imports
it: it is a *web-service starter*, ``async start(service, host, port, ssl_context=None)``
returning an object with ``async close()``. Without one the broker serves the binary protocol
only.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from typing import TYPE_CHECKING, Awaitable, Callable, Protocol

from ..auth import AuthenticationService, tls
from ..auth.authorization import AuthorizationService
from ..compaction.hooks import PostCompactionHook
from ..config import Config, int_setting, setting
from ..errors import InvalidConfiguration, StorageError
from ..storage.resources.fence import Fence, lost_fence
from . import compacted_source, security
from .admission import ConnectionCounter, handshake_deadline_seconds
from .connection import ServerConnection
from .entry_cache import EntryCacheManager
from .inactive_topics import InactiveTopicSweeper
from .latest_values import LatestValues
from .lookup import Listeners, listeners_from_config
from .schema_registry import SchemaRegistry
from .sync_threads import SyncThreads
from .topic_ownership import TopicManager
from .background import stop_task
from .cluster import ClusterService, cluster_enabled
from .compaction_monitor import CompactionMonitor

if TYPE_CHECKING:
    from ..storage import Storage
    from .entry_source import EntrySource
    from .topics import Topic

log = logging.getLogger(__name__)

# Threads for storage calls: appends of different topics, reads and cursor writes run side by
# side; SQLite and fsync release the GIL.
STORAGE_THREADS = 8
# With ledgers in an object store (``objectLedgerStorageUrl``), group flush on or off: a topic's
# sync holds its thread for the flush interval and its write (one PUT alone; in a group, the
# write in flight, the group's PUT and its metadata commit) -- waits on the network, no CPU --
# while the broker's loop goes on writing its SENDs into the ledger's buffer (object ledgers
# take writes on the loop). With 8 threads at most 8 topics of a broker flush at a time and a
# group has at most 8 members; the others wait a whole write for a thread. 30 topics on 3
# brokers (bench/cluster_many_ab.py, cluster_many_candidates_1.json, interleaved, load 11-25):
# group flush on, 78 messages per object write with 8 threads, 91 with 64, and 1.32 against
# 1.63 times the throughput of the head before (median of per-round ratios), at the same CPU
# per message. 64 was the count for the group flush before stop 37; the slow chaos test of
# test_cluster_failover was seen failing under load ~35 with 8 and with 64 alike.
STORAGE_THREADS_OBJECT_LEDGERS = 64
# Recently published entries kept in memory for consumers that keep up, per topic (in all:
# managedLedgerCacheSizeMB, whose default is in config).
TAIL_CACHE_BYTES_PER_TOPIC = 32 * 1024 * 1024
# How long shutdown waits for in-flight work before closing storage anyway.
SHUTDOWN_GRACE_SECONDS = 10.0


class RunningWebService(Protocol):
    """What a web-service starter returns: the ports it bound (None: that port is off) and how
    to stop it (``admin.server.WebService`` is the one the entry point hands in)."""

    port: int | None
    tls_port: int | None

    async def close(self) -> None: ...


# async start(service, host, port, ssl_context=None, tls_port=None) -> RunningWebService
WebServiceStarter = Callable[..., Awaitable[RunningWebService]]


def _wildcard_advertised_host() -> str:
    """Host name to advertise when bound to every interface: this machine's name when it
    resolves (remote clients need it in lookup answers), else the loopback address."""
    import socket

    name = socket.gethostname()
    try:
        socket.gethostbyname(name)
        return name
    except OSError:
        return "127.0.0.1"


class ServerState:
    """Every connection and background task of the broker."""

    def __init__(self) -> None:
        self.connections: set[ServerConnection] = set()
        self.tasks: set[asyncio.Task] = set()
        # connections with output queued this loop turn (ServerConnection.write); each also
        # has its own flush scheduled, which empties the list (so it never outgrows a turn)
        self.unflushed: list[ServerConnection] = []
        # True while code that runs ``flush_writes`` before it returns queues output (a topic
        # sending what it appended, ``Topic._dispatch_appended``): a connection's write then
        # only joins ``unflushed``, with no flush of its own scheduled (one loop turn less)
        self.flushing_now = False

    def flush_writes(self) -> None:
        """Write out what every connection queued so far, now rather than at the end of the
        loop turn (a topic calls this after answering a durable batch: receipts then leave
        before the loop polls for more input)."""
        conns = self.unflushed
        if conns:
            pending = conns.copy()
            conns.clear()
            for conn in pending:
                conn.flush()

    def add_connection(self, conn: ServerConnection) -> None:
        self.connections.add(conn)

    def remove_connection(self, conn: ServerConnection) -> None:
        self.connections.discard(conn)

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())


class Housekeeping:
    """Periodic storage chores of the loaded topics, every ``retentionCheckIntervalInSeconds``:
    roll a ledger that is past its age limit (so an idle topic's ledger still closes), then
    delete the ledgers retention no longer keeps (``Storage.run_maintenance``, in the pool).
    """

    def __init__(self, service: "BrokerService") -> None:
        self.service = service
        self.interval = max(1, int(service.config["retentionCheckIntervalInSeconds"]))
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = self.service.state.spawn(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.run_once()

    async def run_once(self) -> None:
        if self.service.shutting_down:
            return
        try:
            deleted = await self.service.run_blocking(self.service.storage.run_maintenance)
        except Exception:  # noqa: BLE001 - the timer keeps going; storage logs per topic
            log.exception("storage maintenance failed")
            return
        for topic, ids in deleted.items():
            log.info("retention deleted ledgers %s of %s", ids, topic)

    async def close(self) -> None:
        await stop_task(self._task)


def _entry_cache_manager(config: Config) -> EntryCacheManager:
    """The broker-wide entry cache bounds (``entry_cache``) from Pulsar's keys."""

    return EntryCacheManager(
        max(0, int_setting(config, "managedLedgerCacheSizeMB")) << 20,
        max(0, int_setting(config, "managedLedgerCacheEvictionTimeThresholdMillis")) / 1000,
    )


class BrokerService:
    """What every connection shares: config, storage, topics, schemas, the thread pool.

    Collaborators from outside the broker -- the opened ``storage``, the ``authentication`` built
    from the config, the ``post_compaction_hooks`` of the adapters -- are handed in by the entry
    point (``cli/standalone.py``). The broker's own parts (topics, schemas, the compaction
    monitor, the timers) are built here, so every attribute exists, typed, from construction on;
    only the addresses (``broker_url`` ... ``listeners``) and ``cluster`` are filled in by
    ``BrokerServer.start``, once the ports they name are bound.
    """

    def __init__(
        self,
        config: Config,
        storage: Storage,
        broker_url: str = "",
        web_url: str | None = None,
        *,
        authentication: AuthenticationService | None = None,
        post_compaction_hooks: Sequence[PostCompactionHook] = (),
    ) -> None:
        self.config = config
        self.storage = storage
        self.broker_url = broker_url
        self.web_url = web_url
        # the TLS twins (pulsar+ssl://, https://), None while a TLS port is off
        self.broker_url_tls: str | None = None
        self.web_url_tls: str | None = None
        self.listeners: Listeners | None = None  # advertised addresses (lookup), set at start
        self.cluster_name = str(setting(config, "clusterName"))
        # broker.cluster.ClusterService when metadataStoreUrl is shared (zk:); None on one broker.
        # Set by BrokerServer.start after the ports are bound: its broker id is the web URL.
        self.cluster: ClusterService | None = None
        if cluster_enabled(config):
            # until the cluster service runs (after the ports are bound), this broker owns no
            # bundle: a client reaching it first -- after a restart, with a multi-host service
            # URL -- is refused (Fenced: ServiceNotReady, retriable). The storage's default,
            # NO_FENCE, served the topic here with unfenced ledger-list commits while its owner
            # wrote it too: acknowledged messages were lost (the chaos test, seed 3587397996)
            storage.fence_provider = _not_joined
        # part of generated producer names: unique per broker run (a restart must not reuse them)
        self.instance_id = os.urandom(3).hex()
        # monotonic seconds for the broker's TTLs (read-compacted settings, reader pins); tests
        # that need time to pass replace it rather than sleep
        self.clock: Callable[[], float] = time.monotonic
        self.tail_cache_bytes = TAIL_CACHE_BYTES_PER_TOPIC
        self.tail_cache_budget = _entry_cache_manager(config)
        self.state = ServerState()
        # brokerMaxConnections / brokerMaxConnectionsPerIp (admission)
        self.connection_counter = ConnectionCounter(
            {k: int_setting(config, k) for k in ("brokerMaxConnections", "brokerMaxConnectionsPerIp")}
        )
        threads = STORAGE_THREADS_OBJECT_LEDGERS if config.get("objectLedgerStorageUrl") else STORAGE_THREADS
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="storage")
        # the topics' syncers (Topic._start_sync): as many threads at most, handed over cheaply
        self.sync_threads = SyncThreads(threads, "sync")
        # who clients are (compactmq.auth); a disabled service (no providers) when none is given
        self.authentication: AuthenticationService = (
            authentication if authentication is not None else AuthenticationService(enabled=False)
        )
        # what a role may do: checks run only with authorizationEnabled; the admin API stores
        # grants through it either way
        self.authorization = AuthorizationService(config, storage.resources)
        self.topics = TopicManager(self)
        self.schemas = SchemaRegistry(self)
        # the latest value of a key (GET .../latest/{key}): tail key indexes under one bound
        self.latest_values = LatestValues.from_config(config)
        # read-compacted subscriptions: Topic -> EntrySource (issue 5); None reads the topic
        self.compacted_source_factory: Callable[[Topic], EntrySource] | None = compacted_source.factory
        self.shutting_down = False
        # compaction.hooks.PostCompactionHook: what the adapters run after a committed compaction
        self.post_compaction_hooks: tuple[PostCompactionHook, ...] = tuple(post_compaction_hooks)
        # runs compactions and serves each topic's compaction service (read-compacted readers,
        # stats); BrokerServer.start starts it after the ports listen
        self.compaction_monitor = CompactionMonitor(self)
        self.housekeeping = Housekeeping(self)
        self.inactive_topics = InactiveTopicSweeper(self)
        self.credential_refresher = security.CredentialRefresher(self)
        self.started_ms = int(time.time() * 1000)

    def run_blocking(self, fn: Callable, *args) -> asyncio.Future:
        """Run a blocking (storage) call in the thread pool."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.executor, functools.partial(fn, *args))


def check_ports(config: Config) -> None:
    """``InvalidConfiguration`` when a port pair (plain, TLS) is off altogether: the entry point
    asks before storage opens, so the error is one line and nothing was started."""
    for name, plain, secure in (
        ("brokerServicePort", config["brokerServicePort"], tls.broker_port_tls(config)),
        ("webServicePort", config["webServicePort"], tls.web_port_tls(config)),
    ):
        if plain is None and secure is None:
            raise InvalidConfiguration(
                f"{name} is empty and {name}Tls is not set: set one of them "
                f"(an empty {name} turns the plain port off, for a TLS-only broker)"
            )


class BrokerServer:
    """Listens on the binary port, and on its TLS twin when ``brokerServicePortTls`` is set; hands
    the web port(s) to the web service, when given one. As in Pulsar, an empty
    ``brokerServicePort`` / ``webServicePort`` turns the plain port off (a TLS-only broker); lookups
    then answer an empty plain URL beside the TLS one.

    Its collaborators are built by the entry point (``cli/standalone.build_server``) and handed
    in: the ``service`` (with its storage open), the TLS ``ssl_context`` of the TLS ports, the
    ``web_service`` starter. The server owns them from then on: ``shutdown`` (or a failed
    ``start``) closes the service's storage."""

    def __init__(
        self,
        service: BrokerService,
        *,
        ssl_context: ssl.SSLContext | None = None,
        web_service: WebServiceStarter | None = None,
    ) -> None:
        config = self.config = service.config
        self.service = service
        self.host: str = config["bindAddress"]
        self.port: int | None = config["brokerServicePort"]
        self.web_port: int | None = config["webServicePort"]
        self.port_tls = tls.broker_port_tls(config)
        self.web_port_tls = tls.web_port_tls(config)
        if (self.port_tls is not None or self.web_port_tls is not None) and ssl_context is None:
            raise InvalidConfiguration("a TLS port is set but no TLS context was built for it")
        self._servers: list[asyncio.AbstractServer] = []
        self._web_service = web_service
        self._web: RunningWebService | None = None
        self._ssl_context = ssl_context
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        check_ports(self.config)
        listeners_from_config(self.config, "pulsar://127.0.0.1:1", None)  # bad settings fail before binding
        advertised = self.config["advertisedAddress"] or self.host
        if advertised in ("0.0.0.0", "::", ""):
            advertised = _wildcard_advertised_host()
        service = self.service
        try:
            if self.port is not None:
                self.port = await self._listen(self.port, None)
            if self.port_tls is not None:
                self.port_tls = await self._listen(self.port_tls, self._ssl_context)
        except BaseException:
            for server in self._servers:
                server.close()
            await asyncio.get_running_loop().run_in_executor(None, service.storage.close)
            raise
        service.broker_url = f"pulsar://{advertised}:{self.port}" if self.port is not None else ""
        if self.port_tls is not None:
            service.broker_url_tls = f"pulsar+ssl://{advertised}:{self.port_tls}"
        service.web_url = self._web_url(advertised)
        service.listeners = listeners_from_config(
            self.config, service.broker_url, service.web_url, service.broker_url_tls
        )
        try:
            await service.compaction_monitor.start()
            service.housekeeping.start()
            service.inactive_topics.start()
            interval_ms = int_setting(self.config, "managedLedgerCacheEvictionIntervalMs")
            service.tail_cache_budget.start(service.state.spawn, max(1, interval_ms) / 1000)
            service.credential_refresher.start()
            await self.start_web()
        except BaseException:
            # e.g. the web port is taken: undo what started (close storage cleanly), then report
            await self.shutdown()
            raise
        service.web_url = self._web_url(advertised)  # the port bound, if 0 was asked
        if self.web_port_tls is not None and self._web is not None:
            service.web_url_tls = f"https://{advertised}:{self.web_port_tls}"
        # again, now that the web ports are bound (the first call validated the settings early)
        service.listeners = listeners_from_config(
            self.config, service.broker_url, service.web_url, service.broker_url_tls, service.web_url_tls
        )
        await self._join_cluster()

    async def _join_cluster(self) -> None:
        """Register in the cluster when the metadata store is shared (``broker.cluster``); last,
        so that no bundle is assigned here before every URL this broker advertises is bound.
        Built here rather than by the entry point: the broker's id in the cluster is the web URL
        it bound, known only now."""
        if not cluster_enabled(self.config):
            return
        service = self.service
        service.cluster = ClusterService(service)
        try:
            await service.cluster.start()
        except BaseException:
            await self.shutdown()
            raise

    def _web_url(self, advertised: str) -> str:
        return f"http://{advertised}:{self.web_port}" if self.web_port is not None else ""

    async def _listen(self, port: int, ssl_context: ssl.SSLContext | None) -> int:
        """Listen for binary-protocol clients (over TLS with a context); the port bound."""
        service = self.service
        try:
            server = await asyncio.get_running_loop().create_server(
                lambda: ServerConnection(service),
                self.host,
                port,
                ssl=ssl_context,
                # a TLS handshake gets no longer than the CONNECT handshake after it (admission)
                ssl_handshake_timeout=handshake_deadline_seconds(service.config) if ssl_context else None,
                reuse_address=True,
                backlog=1024,
            )
        except OSError as e:
            what = "TLS port " if ssl_context is not None else ""
            raise StorageError(f"cannot listen on {what}{self.host}:{port}: {e.strerror}") from None
        self._servers.append(server)
        return server.sockets[0].getsockname()[1]

    async def start_web(self) -> None:
        """Start the web service (admin REST API, /metrics) the entry point handed in, if any:
        the plain port, and the TLS port when ``webServicePortTls`` is set."""
        if self._web_service is None:
            log.info("no web service given; serving the binary protocol only")
            return
        if self.web_port_tls is None:
            self._web = await self._web_service(self.service, self.host, self.web_port)
        else:
            self._web = await self._web_service(
                self.service,
                self.host,
                self.web_port,
                ssl_context=self._ssl_context,
                tls_port=self.web_port_tls,
            )
        # the ports bound (a configured 0 means any free port)
        self.web_port = self._web.port
        self.web_port_tls = self._web.tls_port

    @property
    def urls(self) -> tuple[str, str]:
        return self.service.broker_url, self.service.web_url

    @property
    def tls_urls(self) -> tuple[str | None, str | None]:
        """``pulsar+ssl://`` and ``https://`` URLs; None for a TLS port that is off."""
        return self.service.broker_url_tls, self.service.web_url_tls

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    async def shutdown(self) -> None:
        """The fixed shutdown order (see the module notes)."""
        service = self.service
        if service.shutting_down:
            return
        service.shutting_down = True
        loop = asyncio.get_running_loop()
        # 1. stop accepting
        for server in self._servers:
            server.close()
        if self._web is not None:
            try:
                await self._web.close()
            except Exception:  # pragma: no cover
                log.exception("closing the web service failed")
        # 1b. in a cluster: leave it, and hand every owned bundle back (its clients move on)
        if service.cluster is not None:
            try:
                await asyncio.wait_for(service.cluster.release_all(), SHUTDOWN_GRACE_SECONDS)
            except Exception:  # noqa: BLE001 - the session's end frees the bundles anyway
                log.exception("releasing the cluster's bundles failed")
        # 2 + 3. producers and consumers are told to reconnect; queued SENDs persist; acks flush
        try:
            await asyncio.wait_for(service.topics.close_all(), SHUTDOWN_GRACE_SECONDS)
        except asyncio.TimeoutError:
            log.warning("topics did not close within %ss", SHUTDOWN_GRACE_SECONDS)
        await service.housekeeping.close()
        await service.inactive_topics.close()
        await service.tail_cache_budget.close()
        await service.credential_refresher.close()
        # 4. close connections, let in-flight tasks finish
        for conn in list(service.state.connections):
            conn.close()
        pending = [t for t in service.state.tasks if t is not asyncio.current_task()]
        if pending:
            done, still = await asyncio.wait(pending, timeout=2.0)
            for t in still:
                t.cancel()
        # compactions stop (their Spark jobs cancelled, ERROR recorded) while storage is still open
        await service.compaction_monitor.close()
        # 5. storage last (the syncs handed over end first)
        await loop.run_in_executor(None, service.sync_threads.shutdown)
        await loop.run_in_executor(None, service.storage.close)
        service.executor.shutdown(wait=True)
        self._stopped.set()


def _not_joined(topic: str) -> Fence:
    """The fence of every topic while this broker has not joined its cluster yet: lost."""
    return lost_fence(f"topic {topic}: this broker has not joined the cluster yet")
