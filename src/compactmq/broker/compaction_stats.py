"""What the compaction monitor remembers of the runs it ran: counters and each topic's last run.

The compaction monitor (``compaction_monitor``) runs compactions; this module keeps their
record for the broker's readers:

* **Counters per topic** (``TopicCompactionStats``), for ``/metrics`` under Pulsar's compaction
  metric names: runs succeeded and failed, messages removed, total duration, and the read and
  write throughput of the last successful run. They count from the broker's start (Prometheus
  counters reset on restart); the persisted status lives in the compaction state instead.
* **One summary log line per run**: entries read and kept, messages removed, bytes in and out,
  duration, the new horizon.
* **Each topic's last run in this process** (``last_run``: the topic stats' ``lastCompactionRun``):
  why it ran, its outcome, the topics of its job and the job's group, and milliseconds per
  phase (the monitor's queue wait and bookkeeping around the run's own steps). The engine's
  split of its step (``sparkMs``: driver, jobs, the rest, the jobs' count) is asked of the
  engine only when someone reads it, so a run never waits for Spark's status store.

``RunRecords`` is driven by the monitor's worker threads (``succeeded``, ``failed``,
``record_last_run``) and read by the admin adapter (``stats``, ``last_runs``, ``last_run``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

log = logging.getLogger("compactmq.broker.compaction_monitor")  # operators grep the monitor's lines


@dataclass
class TopicCompactionStats:
    """Counters of one topic since the broker started (Prometheus counters reset on restart)."""

    removed_event_count: int = 0
    succeed_count: int = 0
    failed_count: int = 0
    duration_ms_total: int = 0
    read_throughput: float = 0.0  # bytes/s of the last successful run
    write_throughput: float = 0.0
    last_summary: dict[str, Any] = field(default_factory=dict)


class RunRecords:
    """The counters and last runs of every topic (module notes)."""

    def __init__(self) -> None:
        self.stats: dict[str, TopicCompactionStats] = {}
        self.last_runs: dict[str, dict[str, Any]] = {}  # topic -> its last run here
        self.lag_runs = 0  # successful runs of topics with a maximum lag (tests and benchmarks)
        self.lag_runs_over_policy = 0  # ... whose oldest message waited longer than the max lag
        self.lag_at_commit_max = 0.0  # ... the longest any oldest message waited (seconds)

    def failed(self, topic: str, elapsed_ms: int) -> None:
        """Count a failed run of ``elapsed_ms``."""
        stats = self.stats.setdefault(topic, TopicCompactionStats())
        stats.failed_count += 1
        stats.duration_ms_total += elapsed_ms

    def succeeded(self, topic: str, reason: str, result: Any, bytes_in: int, bytes_out: int) -> None:
        """Count a successful run (a ``CompactionResult``) and log its summary line."""
        stats = self.stats.setdefault(topic, TopicCompactionStats())
        seconds = max(result.duration_ms / 1000, 1e-3)
        stats.succeed_count += 1
        stats.removed_event_count += result.removed_event_count
        stats.duration_ms_total += result.duration_ms
        stats.read_throughput = bytes_in / seconds
        stats.write_throughput = bytes_out / seconds
        stats.last_summary = {
            "entriesRead": result.entries_read,
            "messagesRead": result.messages_read,
            "entriesKept": result.entries_written,
            "messagesKept": result.messages_kept,
            "messagesRemoved": result.removed_event_count,
            "bytesIn": bytes_in,
            "bytesOut": bytes_out,
            "durationMs": result.duration_ms,
        }
        log.info(
            "compaction of %s (%s) done: entries read %d (messages %d), kept %d (messages %d), "
            "removed %d messages, bytes in %d, bytes out %d, duration %.2fs, horizon %s",
            topic,
            reason,
            result.entries_read,
            result.messages_read,
            result.entries_written,
            result.messages_kept,
            result.removed_event_count,
            bytes_in,
            bytes_out,
            result.duration_ms / 1000,
            _pos(result.horizon),
        )

    def record_last_run(self, run: Any, outcome: Any) -> None:
        """The topic's last run (a ``RunProgress`` and its result or exception): why it ran, its
        outcome, the topics of its job, its job group, and where its time went."""
        failed = isinstance(outcome, BaseException)
        self.last_runs[run.topic] = {
            "reason": run.reason,
            "status": "ERROR" if failed else "SUCCESS",
            "jobTopics": list(run.job_group),
            "jobGroup": None if failed else _job_of(outcome),
            "queuedAt": int(run.queued_at * 1000),
            "phasesMs": {k: round(v * 1000, 1) for k, v in run.phases.items()},
            "timelineMs": _timeline(run),
        }
        if getattr(run, "lag_plan", None):
            self.last_runs[run.topic]["lagPlan"] = dict(run.lag_plan)
        lag = run.lag_at_commit() if not failed else None
        if lag is not None:
            self.last_runs[run.topic]["lagAtCommitMs"] = int(lag * 1000)
            if run.max_lag > 0:
                self.lag_runs += 1
                self.lag_runs_over_policy += lag > run.max_lag
                self.lag_at_commit_max = max(self.lag_at_commit_max, lag)
        split = getattr(outcome, "engine_seconds", None)
        if callable(split):
            self.last_runs[run.topic]["sparkMs"] = split  # asked of the engine when someone looks

    def last_failed(self, topic: str) -> bool:
        """Whether the topic's last run here failed."""
        return (self.last_runs.get(topic) or {}).get("status") == "ERROR"

    def last_run(self, topic: str) -> Optional[dict[str, Any]]:
        """(worker thread) The topic's last run in this process, None before its first; the
        engine's split of its step (``sparkMs``) is read on the first look."""
        last = self.last_runs.get(topic)
        if last is not None and callable(last.get("sparkMs")):
            try:
                split = last["sparkMs"]()
            except Exception:  # a timing never fails a stats request
                split = None
            last = dict(last)
            if split:
                last["sparkMs"] = {k: round(float(v) * 1000, 1) for k, v in split.items()}
                last["sparkMs"]["count"] = int(split.get("count", 0))
            else:
                last.pop("sparkMs")
            self.last_runs[topic] = last
        return last


def _timeline(run: Any) -> dict[str, Optional[int]]:
    """When the run's topic fell due, was checked, queued, started and committed (epoch ms of the
    monitor's clock), and when its oldest uncompacted message was published."""

    def ms(t: Optional[float]) -> Optional[int]:
        return None if t is None else int(t * 1000)

    return {
        "oldestPublished": run.oldest_ms,
        "due": ms(run.due_at),
        "checked": ms(run.checked_at),
        "queued": ms(run.queued_at),
        "started": ms(run.started_at),
        "committed": ms(run.committed_at),
    }


def _job_of(result: Any) -> Optional[str]:
    """The engine's job group of a committed run, as the run recorded it (None when unknown)."""
    job = getattr(result, "job", None)
    return job if isinstance(job, str) else None


def _pos(p) -> str:
    return "none" if p is None else f"{p[0]}:{p[1]}"


__all__ = ["RunRecords", "TopicCompactionStats"]
