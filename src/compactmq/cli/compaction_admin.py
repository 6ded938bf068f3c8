"""``compactmq topics compact`` and ``compaction-status``, with a live progress bar.

``compact`` asks the broker to start a compaction (``PUT .../compaction``); with ``--wait`` (and
``compaction-status --wait-complete``) the CLI polls ``GET .../compaction`` until the run leaves
RUNNING, redrawing one line from the progress the broker reports (``render_progress``), and
exits 1 when the run ended in ERROR. A partitioned topic reports an aggregate status and, with
``--per-partition``, one line per partition.
"""

from __future__ import annotations

import sys
import time

from .admin_client import AdminClient, topic_path
from .admin_client import run_command
from .output import Output


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
        if not a.per_partition:
            return _finish_status(status, out)
    query = "?perPartition=true" if a.per_partition else ""
    return _finish_status(c.request("GET", f"{topic_path(a.topic)}/compaction{query}") or {}, out)


def add_commands(topics) -> None:
    """Add ``compact`` and ``compaction-status`` to the ``topics`` sub-parser."""
    p = topics.add_parser("compact", help="trigger compaction of a topic")
    p.add_argument("topic")
    p.add_argument("-w", "--wait", action="store_true", help="wait for it to finish, showing progress")
    p.set_defaults(func=run_command(_compact))
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
    p.set_defaults(func=run_command(_compaction_status))
