"""``compactmq compact-topic``: run the compaction pipeline of one topic as its own process.

A partitioned topic is compacted whole: all its partitions in one Spark job
(``CompactionServiceFactory.compact_together``), each committing its own view, with one progress
line for the topic; the exit status is 1 when any partition failed (each failure on stderr).

It opens the data directory read-only beside a running broker (appends are the broker's; the
metadata store stays writable), runs the same Spark pipeline as the broker's in-process service
(on ``--spark-master``, local by default), and commits through the metadata store: a running
broker picks the new compacted ledger up from there. Progress goes to stderr as one line that
updates in place; the result goes to stdout (``--output json`` for a JSON document).

A run reads only sealed ledgers, so the job first has the topic's current ledger sealed
(``storage.seal``): by the running broker, asked through a request in the metadata store, or --
when no broker holds the data directory -- by itself, opening the directory read-write for the
moment of the rollover. ``--seal-timeout`` bounds the wait for a broker's answer; without one the
run compacts the ledgers already sealed and says so on stderr.

It needs no network credentials (it talks to no broker over the network), but it refuses to
start when it cannot read the data directory (``check_data_dir``), with one line saying why.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ..config import load_config, parse_override
from ..storage.modes import PRIVATE_UMASK
from ..errors import InvalidConfiguration
from .output import Output


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "compact-topic",
        help="compact one topic now, in this process (Spark), and commit the result",
        description="Run topic compaction out of the broker's process and commit it through the "
        "metadata store; a running broker switches to the new compacted view.",
    )
    p.add_argument(
        "--topic", required=True, help="topic name (short names expand to persistent://public/default/...)"
    )
    p.add_argument("--data-dir", help="the broker's data directory (config key dataDir)")
    p.add_argument("--spark-master", metavar="URL", help="Spark master, e.g. local[4] or spark://host:7077")
    p.add_argument("--config", metavar="FILE", help="broker.conf-style file of key=value lines")
    p.add_argument(
        "--config-override",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one config key (repeatable), e.g. spark.driver.memory=4g",
    )
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument(
        "--seal-timeout",
        metavar="SECONDS",
        type=float,
        default=30.0,
        help="how long to wait for a running broker to seal the topic's current ledger (default 30)",
    )
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace):
    overrides: dict[str, str] = dict(parse_override(item) for item in args.config_override)
    if args.data_dir is not None:
        overrides["dataDir"] = args.data_dir
    if args.spark_master is not None:
        overrides["spark.master"] = args.spark_master
    return load_config(args.config, overrides)


# The first bytes of every SQLite database file.
_SQLITE_MAGIC = b"SQLite format 3\x00"


def check_data_dir(data_dir: Path, topic: str) -> None:
    """Refuse to start unless ``data_dir`` is a broker data directory this process can read.

    compact-topic needs no network credentials: it reads the ledgers and commits through the
    metadata store directly, so file permissions are its access control. Checking by reading
    (not ``os.access``) gives the operator one clear line instead of a Spark stack trace, and
    keeps the job from creating a fresh, empty data directory where it was pointed by mistake.
    """
    where = f"cannot compact {topic}: data directory {data_dir}"
    if not data_dir.exists():
        raise InvalidConfiguration(f"{where} does not exist (give the broker's dataDir with --data-dir)")
    if not data_dir.is_dir():
        raise InvalidConfiguration(f"{where} is not a directory")
    try:
        os.listdir(data_dir)
        with open(data_dir / "metadata.db", "rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        raise InvalidConfiguration(f"{where} has no metadata.db: not a broker's data directory") from None
    except (PermissionError, IsADirectoryError) as e:
        raise InvalidConfiguration(
            f"{where} cannot be read ({e.strerror}: {e.filename}); run as the broker's user"
        ) from None
    if head != _SQLITE_MAGIC:
        raise InvalidConfiguration(f"{where}: metadata.db is not a SQLite database")


class ProgressLine:
    """``compact-topic <topic>: phase-one  42% (420000/1000000 entries) 3.1s`` on stderr."""

    def __init__(self, topic: str, stream=None, enabled: bool = True):
        self.topic = topic
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.t0 = time.monotonic()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last: tuple[str, int] | None = None

    def __call__(self, p) -> None:
        if not self.enabled:
            return
        pct = 100 * p.entries_processed // p.entries_total if p.entries_total else 100
        line = (
            f"compact-topic {self.topic}: {p.phase:<9} {pct:3d}% "
            f"({p.entries_processed}/{p.entries_total} entries) {time.monotonic() - self.t0:.1f}s"
        )
        if self.tty:
            self.stream.write("\r" + line)
        elif (p.phase, pct // 25) != self._last:  # a log file gets a few lines, not hundreds
            self.stream.write(line + "\n")
        self._last = (p.phase, pct // 25)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")


def run(args: argparse.Namespace) -> int:
    from ..naming import canonical

    config = build_config(args)
    os.umask(PRIVATE_UMASK)  # the files this job writes into the data directory are owner-only
    topic = canonical(args.topic)
    if not topic.startswith("persistent://"):
        from ..errors import NotAllowed

        raise NotAllowed(
            f"{topic}: compaction applies only to persistent topics (a non-persistent topic stores nothing)"
        )
    check_data_dir(config.data_dir, topic)
    partitions = _partitions_of(config, topic)
    topics = [f"{topic}-partition-{i}" for i in range(partitions)] if partitions else [topic]
    from ..storage.seal import NOT_SEALED, seal_before_compaction

    deadline = time.monotonic() + args.seal_timeout
    for name in topics:
        left = max(0.0, deadline - time.monotonic())
        if seal_before_compaction(config.data_dir, config, name, timeout=left) == NOT_SEALED:
            print(
                f"compact-topic {name}: the broker did not seal the current ledger within {args.seal_timeout:g}s; "
                "compacting the sealed ledgers only",
                file=sys.stderr,
            )
    if partitions:
        return _run_partitioned(args, config, topic, topics)
    result = _compact(config, topics, ProgressLine(topic, enabled=not args.quiet))[0]
    if isinstance(result, Exception):
        raise result
    Output(args.output).result(_body(result), _text)
    return 0


def _partitions_of(config, topic: str) -> int:
    """The partitions of ``topic`` when it is a partitioned topic, else 0 (read from the store the
    broker's ``configurationMetadataStoreUrl``/``metadataStoreUrl`` names)."""
    from ..naming import TopicName
    from ..storage.metadata_store import store_from_config
    from ..storage.resources import PulsarResources

    store = store_from_config(config, configuration=True)
    try:
        return int(PulsarResources(store).partitioned_topics.partitions(TopicName.parse(topic)) or 0)
    finally:
        store.close()


def _compact(config, topics: list[str], progress: "ProgressLine") -> list:
    """Compact ``topics`` (the partitions of one topic: together, in one Spark job) and return
    each one's ``CompactionResult`` or exception; ``progress`` gets one line for all of them."""
    from ..compaction import load_factory
    from ..storage import Storage

    storage = Storage(config.data_dir, config, read_only=True)
    try:
        factory = load_factory(config, storage)
        services = [factory.new_service(t) for t in topics]
        try:
            if len(services) == 1:
                try:
                    return [services[0].compact(progress)]
                except Exception as e:
                    return [e]
            total = TotalProgress(len(services), progress)
            return factory.compact_together(services, [total.of(i) for i in range(len(services))])
        finally:
            progress.close()
            for service in services:
                service.close()
            factory.close()
    finally:
        storage.close()


class TotalProgress:
    """The partitions' progress callbacks summed into one: one progress line for the topic."""

    def __init__(self, members: int, report) -> None:
        import threading

        self.report = report
        self._lock = threading.Lock()
        self._latest: list = [None] * members

    def of(self, index: int):
        def update(p) -> None:
            from ..compaction import CompactionProgress

            with self._lock:
                self._latest[index] = p
                seen = [q for q in self._latest if q is not None]
                phases = sorted({q.phase for q in seen})
                total = CompactionProgress(
                    phases[0] if len(phases) == 1 else "/".join(phases),
                    sum(q.entries_processed for q in seen),
                    sum(q.entries_total for q in seen),
                )
                self.report(total)

        return update


def _run_partitioned(args: argparse.Namespace, config, topic: str, topics: list[str]) -> int:
    outcomes = _compact(config, topics, ProgressLine(topic, enabled=not args.quiet))
    per: dict = {}
    failed = 0
    for name, outcome in zip(topics, outcomes):
        if isinstance(outcome, Exception):
            failed += 1
            per[name] = {"topic": name, "error": str(outcome) or type(outcome).__name__}
            print(f"compact-topic {name}: failed: {per[name]['error']}", file=sys.stderr)
        else:
            per[name] = _body(outcome)
    ok = [b for b in per.values() if "error" not in b]
    body = {
        "topic": topic,
        "partitions": per,
        "failedPartitions": failed,
        "messagesRead": sum(b["messagesRead"] for b in ok),
        "messagesKept": sum(b["messagesKept"] for b in ok),
        "entriesWritten": sum(b["entriesWritten"] for b in ok),
        "removedEventCount": sum(b["removedEventCount"] for b in ok),
        "durationMs": max((b["durationMs"] for b in ok), default=0),
    }
    Output(args.output).result(body, _partitioned_text)
    return 1 if failed else 0


def _body(result) -> dict:
    return {
        "topic": result.topic,
        "compactedLedgerId": result.compacted_ledger_id,
        "horizon": str(result.horizon) if result.horizon is not None else None,
        "entriesRead": result.entries_read,
        "messagesRead": result.messages_read,
        "entriesWritten": result.entries_written,
        "messagesKept": result.messages_kept,
        "removedEventCount": result.removed_event_count,
        "durationMs": result.duration_ms,
    }


def _partitioned_text(b: dict) -> str:
    lines = [
        _text(p) if "error" not in p else f"{p['topic']}: failed: {p['error']}"
        for p in b["partitions"].values()
    ]
    n = len(b["partitions"])
    lines.append(
        f"{b['topic']}: {n - b['failedPartitions']} of {n} partitions compacted in one job: "
        f"{b['messagesKept']} of {b['messagesRead']} messages kept ({b['durationMs']} ms)"
    )
    return "\n".join(lines)


def _text(b: dict) -> str:
    if b["compactedLedgerId"] is None:
        return f"{b['topic']}: nothing to compact (the topic is empty)"
    return (
        f"{b['topic']}: compacted ledger {b['compactedLedgerId']} up to {b['horizon']}: "
        f"{b['messagesKept']} of {b['messagesRead']} messages kept in {b['entriesWritten']} entries "
        f"({b['durationMs']} ms)"
    )
