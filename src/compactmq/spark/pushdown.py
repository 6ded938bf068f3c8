"""Filters Spark pushes into the source (``DataSourceReader.pushFilters``, Spark 4.1+).

A query such as ``where __key in ('a', 'b') and __publishTime >= '2026-01-01'`` hands the source
the conjuncts it could use. This module keeps those it understands as a ``Pushed`` value:

* ``__key`` ``=`` / ``IN`` (string values): only rows with one of these keys are built. The rows of
  ``raw`` and ``compacted`` are independent messages, and ``latest`` is a fold per key (a key's row
  depends on that key's messages alone, and a keyless row never equals a string), so dropping the
  other keys' rows changes nothing else in any view.
* ``__publishTime`` ``=``, ``<``, ``<=``, ``>``, ``>=`` (a timestamp): a publish-time window in
  milliseconds, intersected with ``startingTime`` / ``endingTime`` and applied where those are
  (per message, after whole entries outside it are skipped). Not for ``latest``: there the filter
  applies to the folded row, and filtering messages before the fold would change which row a key
  gets.

Every filter is also handed back to Spark, which evaluates it again on what the source returns:
the source only has to return a superset of the matching rows, never exactly them, so a rounding
or a type this module reads differently from Spark can cost speed, never a row. (Spark's
``filterPushdown`` conf must be on for a Python source to get filters: ``compactmq.spark.register``
turns it on.)
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, replace

KEY = "__key"
PUBLISH_TIME = "__publishTime"
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


@dataclass(frozen=True)
class Pushed:
    """What the pushed filters allow: keys (None: any) and a publish-time window in ms
    (``time_lo`` inclusive, ``time_hi`` exclusive, None: unbounded)."""

    keys: frozenset | None = None
    time_lo: int | None = None
    time_hi: int | None = None

    def with_keys(self, keys) -> Pushed:
        keys = frozenset(k for k in keys if isinstance(k, str))
        return replace(self, keys=keys if self.keys is None else self.keys & keys)

    def with_time(self, lo: int | None, hi: int | None) -> Pushed:
        if lo is not None and (self.time_lo is None or lo > self.time_lo):
            self = replace(self, time_lo=lo)
        if hi is not None and (self.time_hi is None or hi < self.time_hi):
            self = replace(self, time_hi=hi)
        return self


def _micros(value) -> int | None:
    """Microseconds since the epoch of an aware datetime (None for anything else)."""
    if isinstance(value, _dt.datetime) and value.tzinfo is not None:
        return (value - _EPOCH) // _dt.timedelta(microseconds=1)
    return None


def _time_bounds(name: str, micros: int) -> tuple[int | None, int | None]:
    """A publish-time window in ms holding every message whose ``publish_ms * 1000`` satisfies
    ``name`` against ``micros`` (one ms of slack on each side: Spark checks exactly)."""
    ms = micros // 1000
    if name in ("GreaterThan", "GreaterThanOrEqual"):
        return ms - 1, None
    if name in ("LessThan", "LessThanOrEqual"):
        return None, ms + 2
    if name == "EqualTo":
        return ms - 1, ms + 2
    return None, None


def push(filters, view: str) -> Pushed:
    """The ``Pushed`` of the conjuncts ``filters`` (Spark's ``pyspark.sql.datasource`` filters)."""
    pushed = Pushed()
    for f in filters:
        name = type(f).__name__
        column = tuple(getattr(f, "attribute", ()))
        if column == (KEY,):
            if name == "EqualTo" and isinstance(f.value, str):
                pushed = pushed.with_keys([f.value])
            elif name == "In":
                pushed = pushed.with_keys(f.value)
        elif column == (PUBLISH_TIME,) and view != "latest":
            micros = _micros(getattr(f, "value", None))
            if micros is not None:
                pushed = pushed.with_time(*_time_bounds(name, micros))
    return pushed


def time_window(opts, pushed: Pushed):
    """``opts`` with its startingTime / endingTime narrowed to the pushed window."""
    lo, hi = opts.starting_time, opts.ending_time
    if pushed.time_lo is not None:
        lo = pushed.time_lo if lo is None else max(lo, pushed.time_lo)
    if pushed.time_hi is not None:
        hi = pushed.time_hi if hi is None else min(hi, pushed.time_hi)
    return replace(opts, starting_time=lo, ending_time=hi)
