"""Prometheus ``/metrics``: Pulsar's metric names for compaction and the basic broker metrics.

Labels follow Pulsar's topic-level metrics: ``cluster``, ``namespace``, ``topic``.

Broker metrics: ``pulsar_topics_count`` (per namespace), and per topic
``pulsar_producers_count``, ``pulsar_consumers_count``, ``pulsar_subscriptions_count``,
``pulsar_rate_in`` / ``pulsar_rate_out`` (messages/s), ``pulsar_throughput_in`` /
``pulsar_throughput_out`` (bytes/s), ``pulsar_in_messages_total`` / ``pulsar_in_bytes_total`` /
``pulsar_out_messages_total`` / ``pulsar_out_bytes_total``, ``pulsar_storage_size`` (bytes), ``pulsar_msg_backlog``.

Compaction metrics (per topic): ``pulsar_compaction_removed_event_count``,
``pulsar_compaction_succeed_count``, ``pulsar_compaction_failed_count``,
``pulsar_compaction_duration_time_in_mills`` (total time spent compacting),
``pulsar_compaction_read_throughput`` / ``pulsar_compaction_write_throughput`` (bytes/s of the
last run), ``pulsar_compaction_compacted_entries_count`` / ``..._size`` (the compacted ledger in
force). Run counters start at zero when the broker starts, like any Prometheus counter; the
compacted-ledger figures come from the files and are right after a restart too.

Ours, named in Pulsar's style (Pulsar has no such metrics): ``pulsar_compaction_compacted_keys``
(keys in the compacted view; -1 when the service does not count them),
``pulsar_compaction_lag_seconds`` (age of the oldest uncompacted message, 0 when everything is
compacted: what ``compactionMaxLagSeconds`` bounds), ``pulsar_compaction_last_phase_seconds``
(wall time of each phase of the last run that committed the view, label ``phase``),
``pulsar_compaction_last_job_topics`` (topics that shared the Spark job of the topic's last run
in this broker: the monitor's joint jobs), ``pulsar_compaction_max_lag_unkeepable`` (1 when the
monitor's last check of the topic found its ``compactionMaxLagSeconds`` below the least lag it
can keep: ``broker.compaction_lagbound``), and the broker-wide ``compactmq_compaction_running``,
``compactmq_compaction_jobs_total``, ``compactmq_compaction_monitor_checks_total``,
``compactmq_compaction_engine_warm`` (1 once the background warm-up of ``compactionSparkWarmup``
finished; label ``state``: off, warming, warm or failed), ``compactmq_compaction_max_lag_floor_seconds``
(that least lag, at the last check), ``compactmq_compaction_lag_runs_total`` /
``compactmq_compaction_lag_runs_over_policy_total`` (successful runs of topics with a maximum lag,
and those whose oldest message waited longer than it) and
``compactmq_compaction_lag_at_commit_max_seconds`` (the longest such wait since the start). Object storage (every store of the
process: ``objectLedgerStorageUrl`` ledgers and views, tiered offload), counted where the
objects are written (``offload.blobstore.OBJECT_COUNTERS``): ``compactmq_object_store_puts_total``
(objects written, one per completed upload), ``compactmq_object_store_put_bytes_total`` and
``compactmq_object_store_deletes_total``.

Process and entry-cache metrics come from ``prometheus_client`` (the maintained Prometheus library):
its ``ProcessCollector`` gives the standard ``process_resident_memory_bytes``,
``process_virtual_memory_bytes``, ``process_cpu_seconds_total``, ``process_open_fds``,
``process_max_fds`` and ``process_start_time_seconds``; ``EntryCacheCollector`` gives Pulsar's
managed-ledger cache metrics (label ``cluster``): ``pulsar_ml_count`` (managed ledgers open),
``pulsar_ml_cache_used_size`` (bytes the cache holds, each entry with its in-memory overhead),
``pulsar_ml_cache_entries``, ``pulsar_ml_cache_hits_rate`` / ``pulsar_ml_cache_misses_rate``
(entries/s), ``pulsar_ml_cache_hits_throughput`` / ``pulsar_ml_cache_misses_throughput``
(bytes/s), ``pulsar_ml_cache_evictions`` (eviction operations during the last minute) and the
counters ``pulsar_ml_cache_inserted_entries_total`` / ``pulsar_ml_cache_evicted_entries_total``.

Messages in are the topic's exact count (its live producers' counters plus what its closed
producers published); messages out add up consumers' counters, sampled (what a consumer sent
after the last sample and before it left is not counted). Rates are the difference between two
samples ``RATE_INTERVAL_SECONDS`` apart.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..errors import CompactMQError
from ..naming import TopicName

if TYPE_CHECKING:
    from ..broker.server import BrokerService

RATE_INTERVAL_SECONDS = 2.0
# pulsar_ml_cache_evictions counts the evictions of this last stretch (Pulsar: the last minute)
EVICTIONS_WINDOW_SECONDS = 60.0


@dataclass
class TopicTraffic:
    msg_in: int = 0
    bytes_in: int = 0
    msg_out: int = 0
    bytes_out: int = 0
    rate_in: float = 0.0
    throughput_in: float = 0.0
    rate_out: float = 0.0
    throughput_out: float = 0.0
    _last: tuple[int, int, int, int] = (0, 0, 0, 0)
    _producer_rates: dict[int, float] = field(default_factory=dict)

    def producer_rate(self, serial: int) -> float:
        return self._producer_rates.get(serial, 0.0)


@dataclass
class CacheRates:
    """Rates of the broker's entry cache (``broker.entry_cache.EntryCacheManager``) between
    the last two samples, and the evictions of the last ``EVICTIONS_WINDOW_SECONDS``."""

    hits_rate: float = 0.0
    hits_throughput: float = 0.0
    misses_rate: float = 0.0
    misses_throughput: float = 0.0
    evictions_last_minute: int = 0
    _last: tuple[int, int, int, int] | None = None
    _evictions: collections.deque = field(default_factory=collections.deque)

    def sample(self, cache: Any, now: float, elapsed: float) -> None:
        counters = (cache.hits, cache.hit_bytes, cache.misses, cache.miss_bytes)
        if self._last is not None:
            h, hb, m, mb = (now_ - before for now_, before in zip(counters, self._last))
            self.hits_rate, self.hits_throughput = h / elapsed, hb / elapsed
            self.misses_rate, self.misses_throughput = m / elapsed, mb / elapsed
        self._last = counters
        window = self._evictions
        if not window:  # what was evicted before the first sample counts too
            window.append((now - elapsed, 0))
        window.append((now, cache.evictions))
        while len(window) > 1 and window[0][0] < now - EVICTIONS_WINDOW_SECONDS:
            window.popleft()
        self.evictions_last_minute = cache.evictions - window[0][1]


class TrafficSampler:
    """Per-topic message and byte counters and rates, from the live producers and consumers."""

    def __init__(self, service: BrokerService, clock=time.monotonic) -> None:
        self.service = service
        self.clock = clock
        self._topics: dict[str, TopicTraffic] = {}
        self._seen: dict[tuple[str, int], tuple[int, int]] = {}  # (kind, serial) -> (msgs, bytes)
        self._producer_last: dict[int, int] = {}
        self._last_rate_at = clock()
        self.cache = CacheRates()
        self._lock = threading.Lock()
        self._task: asyncio.Task | None = None

    def topic(self, name: str) -> TopicTraffic:
        with self._lock:
            return self._topics.setdefault(name, TopicTraffic())

    def topics(self) -> dict[str, TopicTraffic]:
        with self._lock:
            return dict(self._topics)

    def refresh(self) -> None:
        """Fold what producers and consumers counted since the last call into the topic totals
        (call on the event loop: it walks the broker's live objects)."""
        loaded = dict(self.service.topics.loaded)
        present: set[tuple[str, int]] = set()
        with self._lock:
            for name, topic in loaded.items():
                t = self._topics.setdefault(name, TopicTraffic())
                # exact: the topic keeps what its closed producers published
                closed_msgs, closed_bytes = topic.closed_producers_in
                live = list(topic.producers.values())
                t.msg_in = closed_msgs + sum(p.messages_in for p in live)
                t.bytes_in = closed_bytes + sum(p.bytes_in for p in live)
                for sub in list(topic.subscriptions.values()):
                    for c in list(sub.consumers):
                        key = ("c", c.serial)
                        present.add(key)
                        out_bytes = c.bytes_out
                        msgs, nbytes = self._seen.get(key, (0, 0))
                        t.msg_out += c.messages_out - msgs
                        t.bytes_out += out_bytes - nbytes
                        self._seen[key] = (c.messages_out, out_bytes)
            for key in [k for k in self._seen if k not in present]:
                del self._seen[key]

    def sample_rates(self) -> None:
        self.refresh()
        now = self.clock()
        loaded = dict(self.service.topics.loaded)
        with self._lock:
            elapsed = max(now - self._last_rate_at, 1e-6)
            self._last_rate_at = now
            for name, t in self._topics.items():
                m_in, b_in, m_out, b_out = t._last
                t.rate_in = (t.msg_in - m_in) / elapsed
                t.throughput_in = (t.bytes_in - b_in) / elapsed
                t.rate_out = (t.msg_out - m_out) / elapsed
                t.throughput_out = (t.bytes_out - b_out) / elapsed
                t._last = (t.msg_in, t.bytes_in, t.msg_out, t.bytes_out)
                rates = {}
                topic = loaded.get(name)
                if topic is not None:
                    for p in topic.producers.values():
                        prev = self._producer_last.get(p.serial, p.messages_in)
                        rates[p.serial] = (p.messages_in - prev) / elapsed
                        self._producer_last[p.serial] = p.messages_in
                t._producer_rates = rates
            # producers that left: their last counts are not needed any more
            live = {serial for t in self._topics.values() for serial in t._producer_rates}
            for serial in [s for s in self._producer_last if s not in live]:
                del self._producer_last[serial]
            self.cache.sample(self.service.tail_cache_budget, now, elapsed)

    def forget(self, name: str) -> None:
        with self._lock:
            self._topics.pop(name, None)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(RATE_INTERVAL_SECONDS)
            self.sample_rates()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


# --- rendering ------------------------------------------------------------------------------------


class _Family:
    def __init__(self, name: str, kind: str, help_: str) -> None:
        self.name, self.kind, self.help = name, kind, help_
        self.samples: list[tuple[dict[str, str], float]] = []

    def add(self, labels: dict[str, str], value: float) -> None:
        self.samples.append((labels, value))

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        for labels, value in self.samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{self.name}{{{text}}} {_number(value)}")
        return "\n".join(lines)


def _escape(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(v: float) -> str:
    if isinstance(v, int) or float(v).is_integer():
        return str(int(v))
    return repr(float(v))


BROKER_FAMILIES = (
    ("pulsar_producers_count", "gauge", "producers attached to the topic"),
    ("pulsar_consumers_count", "gauge", "consumers attached to the topic"),
    ("pulsar_subscriptions_count", "gauge", "subscriptions of the topic (durable cursors and readers)"),
    ("pulsar_rate_in", "gauge", "messages per second published to the topic"),
    ("pulsar_rate_out", "gauge", "messages per second dispatched from the topic"),
    ("pulsar_throughput_in", "gauge", "bytes per second published to the topic"),
    ("pulsar_throughput_out", "gauge", "bytes per second dispatched from the topic"),
    ("pulsar_in_messages_total", "counter", "messages published to the topic since the broker started"),
    ("pulsar_in_bytes_total", "counter", "bytes published to the topic since the broker started"),
    ("pulsar_out_messages_total", "counter", "messages dispatched from the topic since the broker started"),
    ("pulsar_out_bytes_total", "counter", "bytes dispatched from the topic since the broker started"),
    ("pulsar_storage_size", "gauge", "bytes the topic's ledgers hold"),
    ("pulsar_msg_backlog", "gauge", "entries not yet acknowledged, summed over durable subscriptions"),
)

COMPACTION_FAMILIES = (
    ("pulsar_compaction_removed_event_count", "counter", "messages compaction removed"),
    ("pulsar_compaction_succeed_count", "counter", "successful compactions"),
    ("pulsar_compaction_failed_count", "counter", "failed compactions"),
    ("pulsar_compaction_duration_time_in_mills", "counter", "milliseconds spent compacting"),
    ("pulsar_compaction_read_throughput", "gauge", "bytes per second the last compaction read"),
    ("pulsar_compaction_write_throughput", "gauge", "bytes per second the last compaction wrote"),
    ("pulsar_compaction_compacted_entries_count", "gauge", "entries in the compacted ledger in force"),
    ("pulsar_compaction_compacted_entries_size", "gauge", "bytes of the compacted ledger in force"),
    # ours, in Pulsar's style (see the module notes)
    ("pulsar_compaction_compacted_keys", "gauge", "keys in the compacted view in force (-1: not counted)"),
    ("pulsar_compaction_lag_seconds", "gauge", "age of the oldest uncompacted message (0: all compacted)"),
    ("pulsar_compaction_last_phase_seconds", "gauge", "wall time of each phase of the last committed run"),
    (
        "pulsar_compaction_last_job_topics",
        "gauge",
        "topics that shared the Spark job of the last run in this broker (1: alone; 0: none yet)",
    ),
    (
        "pulsar_compaction_max_lag_unkeepable",
        "gauge",
        "1: the topic's compactionMaxLagSeconds is below the least lag the monitor can keep now",
    ),
)


class EntryCacheCollector:
    """Pulsar's managed-ledger cache metrics (see the module notes), for ``prometheus_client``."""

    def __init__(self, service: BrokerService, rates: CacheRates, cluster: str) -> None:
        self.service, self.rates, self.cluster = service, rates, cluster

    def collect(self):
        labels = ["cluster"]
        value = [self.cluster]
        cache = self.service.tail_cache_budget
        count = self.service.storage.open_managed_ledger_count()
        gauges = [
            ("pulsar_ml_count", "managed ledgers open in the broker", count),
            (
                "pulsar_ml_cache_used_size",
                "bytes the entry cache holds (payloads and their overhead)",
                cache.used,
            ),
            ("pulsar_ml_cache_entries", "entries in the entry cache", cache.entries),
            ("pulsar_ml_cache_hits_rate", "entries per second read from the cache", self.rates.hits_rate),
            (
                "pulsar_ml_cache_hits_throughput",
                "bytes per second read from the cache",
                self.rates.hits_throughput,
            ),
            ("pulsar_ml_cache_misses_rate", "entries per second read from storage", self.rates.misses_rate),
            (
                "pulsar_ml_cache_misses_throughput",
                "bytes per second read from storage",
                self.rates.misses_throughput,
            ),
            (
                "pulsar_ml_cache_evictions",
                "cache evictions during the last minute",
                self.rates.evictions_last_minute,
            ),
        ]
        for name, help_, v in gauges:
            g = GaugeMetricFamily(name, help_, labels=labels)
            g.add_metric(value, v)
            yield g
        for name, help_, total in (
            ("pulsar_ml_cache_inserted_entries_total", "entries put in the cache", cache.inserted_entries),
            (
                "pulsar_ml_cache_evicted_entries_total",
                "entries evicted from the cache",
                cache.evicted_entries,
            ),
        ):
            c = CounterMetricFamily(name, help_, labels=labels)
            c.add_metric(value, total)
            yield c


def render_library_metrics(ctx: Any, cluster: str) -> str:
    """The families ``prometheus_client`` renders: process metrics and the entry cache."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    registry.register(EntryCacheCollector(ctx.service, ctx.sampler.cache, cluster))
    return generate_latest(registry).decode()


def render_metrics(ctx: Any) -> str:
    """The Prometheus text exposition of every family (runs in a worker thread)."""
    service = ctx.service
    cluster = service.cluster_name
    traffic = ctx.sampler.topics()  # refreshed by the caller, on the event loop
    loaded = dict(service.topics.loaded)
    families = {name: _Family(name, kind, h) for name, kind, h in BROKER_FAMILIES + COMPACTION_FAMILIES}
    topics = ctx.topic_metadata.topics()
    topics_count = _namespace_topic_counts(ctx, cluster, topics)
    for name in topics:
        _add_topic_metrics(families, ctx, cluster, name, loaded.get(name), traffic.get(name))
    monitor = ctx.monitor
    _add_compaction_metrics(families, ctx, cluster, loaded, monitor)
    out = (
        [topics_count.render()]
        + [fam.render() for fam in families.values()]
        + [fam.render() for fam in _monitor_families(cluster, monitor)]
        + [fam.render() for fam in _object_store_families(cluster)]
    )
    return "\n".join(out) + "\n" + render_library_metrics(ctx, cluster)


def _namespace_topic_counts(ctx: Any, cluster: str, topics: list[str]) -> _Family:
    """``pulsar_topics_count``: one sample per namespace, 0 for a namespace without topics."""
    per_namespace: dict[str, int] = {}
    for name in topics:
        ns = TopicName.parse(name).namespace_name
        per_namespace[ns] = per_namespace.get(ns, 0) + 1
    topics_count = _Family("pulsar_topics_count", "gauge", "topics of the namespace")
    tenants, namespaces = ctx.resources.tenants, ctx.resources.namespaces
    for ns in sorted(n for t in tenants.list_tenants() for n in namespaces.list_namespaces(t)):
        topics_count.add({"cluster": cluster, "namespace": ns}, per_namespace.get(ns, 0))
    return topics_count


def _add_topic_metrics(families: dict, ctx: Any, cluster: str, name: str, topic: Any, t: Any) -> None:
    """The per-topic broker families of ``name`` (``topic`` when loaded, ``t`` its traffic)."""
    labels = {"cluster": cluster, "namespace": TopicName.parse(name).namespace_name, "topic": name}
    producers = [p for p in list(topic.producers.values()) if not p.closed] if topic is not None else []
    consumers = (
        [c for s in list(topic.subscriptions.values()) for c in list(s.consumers)]
        if topic is not None
        else []
    )
    backlog = 0
    subs = set(topic.subscriptions) if topic is not None else set()
    if topic is not None:
        cursors = topic.ledger.cursors()
        subs |= {c.name for c in cursors}
        backlog = sum(c.backlog() for c in cursors if c.durable and c.name != "pulsar.dedup")
        size = topic.ledger.total_size()
    else:
        size = sum(li.size for li in ctx.topic_metadata.ledgers(name))
    f = families
    f["pulsar_producers_count"].add(labels, len(producers))
    f["pulsar_consumers_count"].add(labels, len(consumers))
    f["pulsar_subscriptions_count"].add(labels, len(subs))
    f["pulsar_rate_in"].add(labels, t.rate_in if t else 0)
    f["pulsar_rate_out"].add(labels, t.rate_out if t else 0)
    f["pulsar_throughput_in"].add(labels, t.throughput_in if t else 0)
    f["pulsar_throughput_out"].add(labels, t.throughput_out if t else 0)
    f["pulsar_in_messages_total"].add(labels, t.msg_in if t else 0)
    f["pulsar_in_bytes_total"].add(labels, t.bytes_in if t else 0)
    f["pulsar_out_messages_total"].add(labels, t.msg_out if t else 0)
    f["pulsar_out_bytes_total"].add(labels, t.bytes_out if t else 0)
    f["pulsar_storage_size"].add(labels, size)
    f["pulsar_msg_backlog"].add(labels, backlog)


def _add_compaction_metrics(families: dict, ctx: Any, cluster: str, loaded: dict, monitor: Any) -> None:
    """The per-topic compaction families: every topic compacted or with a run recorded."""
    run_stats = dict(monitor.stats)
    states = ctx.compaction_states()
    for name in sorted(set(run_stats) | set(states)):
        labels = {"cluster": cluster, "namespace": TopicName.parse(name).namespace_name, "topic": name}
        s = run_stats.get(name)
        st = states.get(name)
        entries = size = keys = lag_ms = 0
        phases: dict = {}
        try:
            if st is not None and st.horizon is not None:
                view = ctx.compaction_stats(name)
                entries, size, keys = view.entries, max(0, view.size_bytes), view.keys
                phases = dict(view.last_run_steps or {})
            topic = loaded.get(name)
            ml = topic.ledger if topic is not None else ctx.storage.open_managed_ledger(name, create=False)
            lag_ms = ctx.compaction_lag_ms(ml, st.horizon if st is not None else None)
        except CompactMQError:  # a topic deleted meanwhile
            pass
        f = families
        f["pulsar_compaction_removed_event_count"].add(labels, s.removed_event_count if s else 0)
        f["pulsar_compaction_succeed_count"].add(labels, s.succeed_count if s else 0)
        f["pulsar_compaction_failed_count"].add(labels, s.failed_count if s else 0)
        f["pulsar_compaction_duration_time_in_mills"].add(labels, s.duration_ms_total if s else 0)
        f["pulsar_compaction_read_throughput"].add(labels, s.read_throughput if s else 0)
        f["pulsar_compaction_write_throughput"].add(labels, s.write_throughput if s else 0)
        f["pulsar_compaction_compacted_entries_count"].add(labels, entries)
        f["pulsar_compaction_compacted_entries_size"].add(labels, size)
        f["pulsar_compaction_compacted_keys"].add(labels, keys)
        f["pulsar_compaction_lag_seconds"].add(labels, lag_ms / 1000)
        for phase, seconds in sorted(phases.items()):
            f["pulsar_compaction_last_phase_seconds"].add({**labels, "phase": str(phase)}, float(seconds))
        last = monitor.last_runs.get(name)
        f["pulsar_compaction_last_job_topics"].add(labels, len(last["jobTopics"]) if last else 0)
        bound = monitor.max_lag_status(name)
        f["pulsar_compaction_max_lag_unkeepable"].add(labels, 0 if bound is None or bound["keepable"] else 1)


def _monitor_families(cluster: str, monitor: Any) -> list[_Family]:
    """compactmq's own families about the compaction monitor of this broker."""
    running = _Family("compactmq_compaction_running", "gauge", "compactions queued or running in this broker")
    running.add({"cluster": cluster}, len(monitor.running_topics))
    checks = _Family(
        "compactmq_compaction_monitor_checks_total", "counter", "periodic compaction threshold checks done"
    )
    checks.add({"cluster": cluster}, monitor.checks)
    jobs = _Family(
        "compactmq_compaction_jobs_total",
        "counter",
        "compaction jobs handed to the worker pool (a joint job of several topics counts once)",
    )
    jobs.add({"cluster": cluster}, monitor.jobs_started)
    warm = _Family(
        "compactmq_compaction_engine_warm",
        "gauge",
        "1 once the compaction engine's background warm-up (compactionSparkWarmup) finished",
    )
    warmup = monitor.engine_warmup()
    warm.add(
        {"cluster": cluster, "state": (warmup or {}).get("state", "off")},
        1 if (warmup or {}).get("state") == "warm" else 0,
    )
    return [running, checks, jobs, warm, *_lag_families(cluster, monitor)]


def _lag_families(cluster: str, monitor: Any) -> list[_Family]:
    """compactmq's own families about keeping maximum lags (``broker.compaction_lagbound``)."""
    records = monitor.records
    out = []
    for name, kind, help_, value in (
        (
            "compactmq_compaction_max_lag_floor_seconds",
            "gauge",
            "the least compactionMaxLagSeconds the monitor could keep at its last check",
            round(monitor.lag_bound.last_floor, 3),
        ),
        (
            "compactmq_compaction_lag_runs_total",
            "counter",
            "successful compactions of topics with a maximum lag",
            records.lag_runs,
        ),
        (
            "compactmq_compaction_lag_runs_over_policy_total",
            "counter",
            "... whose oldest uncompacted message waited longer than the maximum lag for the commit",
            records.lag_runs_over_policy,
        ),
        (
            "compactmq_compaction_lag_at_commit_max_seconds",
            "gauge",
            "the longest an oldest uncompacted message waited for a commit since the broker started",
            records.lag_at_commit_max,
        ),
    ):
        fam = _Family(name, kind, help_)
        fam.add({"cluster": cluster}, value)
        out.append(fam)
    return out


def _object_store_families(cluster: str) -> list[_Family]:
    """compactmq's own counters of the objects this process wrote and deleted."""
    from ..storage.offload.blobstore import OBJECT_COUNTERS

    counts = OBJECT_COUNTERS.snapshot()
    out = []
    for name, help_, key in (
        (
            "compactmq_object_store_puts_total",
            "objects written to object storage (completed uploads)",
            "puts",
        ),
        (
            "compactmq_object_store_put_bytes_total",
            "bytes of the objects written to object storage",
            "put_bytes",
        ),
        ("compactmq_object_store_deletes_total", "objects deleted from object storage", "deletes"),
    ):
        fam = _Family(name, "counter", help_)
        fam.add({"cluster": cluster}, counts[key])
        out.append(fam)
    return out
