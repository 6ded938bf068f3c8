"""Where a Spark compaction job's wall time went, from Spark's own status store.

A run's ``spark`` step (``runner``) is one call of the engine; this module splits it, so an
operator can tell a slow job from a slow driver: ``driver`` is the time before Spark received
the first job of the run's job group (building the DataFrames, planning), ``jobs`` the time Spark
had at least one of the group's jobs running (scheduling, Python workers, tasks), and ``other``
the rest (between jobs, adaptive re-planning, collecting the parts). The times come from the
JVM's ``AppStatusStore`` (what the Spark UI shows, kept with the UI off), read by job id; a
handful of py4j calls per run. Anything missing (another Spark, a cluster that dropped the
jobs) gives no split rather than a wrong one.
"""

from __future__ import annotations

from typing import Optional


def job_times(sc, group: str) -> list[tuple[float, float]]:
    """``(submitted, completed)`` epoch seconds of each finished job of ``group``."""
    store = sc._jsc.sc().statusStore()
    out = []
    for job_id in sc.statusTracker().getJobIdsForGroup(group):
        data = store.job(int(job_id))
        sub, end = data.submissionTime(), data.completionTime()
        if sub.isDefined() and end.isDefined():
            out.append((sub.get().getTime() / 1000, end.get().getTime() / 1000))
    return out


def split(sc, group: str, started: float, ended: float) -> Optional[dict]:
    """``{"driver", "jobs", "other", "count"}`` of a run that called Spark from ``started`` to
    ``ended`` (epoch seconds), or None when Spark cannot tell."""
    try:
        times = sorted(job_times(sc, group))
    except Exception:  # best effort: a timing never fails a run
        return None
    if not times:
        return None
    busy = 0.0
    cur_lo, cur_hi = times[0]
    for lo, hi in times[1:]:  # the union of the jobs' intervals
        if lo > cur_hi:
            busy += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    busy += cur_hi - cur_lo
    driver = max(0.0, times[0][0] - started)
    total = max(0.0, ended - started)
    return {
        "driver": round(driver, 4),
        "jobs": round(busy, 4),
        "other": round(max(0.0, total - driver - busy), 4),
        "count": len(times),
    }
