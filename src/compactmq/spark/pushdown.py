"""Filters Spark pushes into the source (``DataSourceReader.pushFilters``, Spark 4.1+).

A query such as ``where __key in ('a', 'b') and __publishTime >= '2026-01-01'`` hands the source
the conjuncts it could use. This module keeps those it understands as a ``Pushed`` value:

* ``__key`` ``=`` / ``IN`` (string values): only rows with one of these keys are built. The rows of
  ``raw`` and ``compacted`` are independent messages, and ``latest`` is a fold per key (a key's row
  depends on that key's messages alone, and a keyless row never equals a string), so dropping the
  other keys' rows changes nothing else in any view. On ``compacted`` / ``latest`` read from the
  files, the compacted part is not scanned at all: the view's key index (``prune.key_entries``)
  names the entries that hold the keys.
* ``__publishTime`` ``=``, ``<``, ``<=``, ``>``, ``>=`` (a timestamp): a publish-time window in
  milliseconds, intersected with ``startingTime`` / ``endingTime`` and applied where those are
  (whole ledgers and entries outside it are skipped by the ledger index, then per message).
* ``__eventTime`` (the same operators): an event-time window, applied per message (the event time
  is only in each message's metadata: nothing can be skipped before parsing). A message without
  an event time has a null ``__eventTime``, which no comparison keeps.
* ``__messageId`` ``=``, ``<``, ``<=``, ``>``, ``>=``, ``IN`` (the serialized ``MessageIdData``
  bytes, compared as Spark compares binary: byte by byte). That order is not the id order (a
  varint's bytes are little-endian groups), but every serialized id starts with the tag and
  varint of its ledger, then those of its entry, so a ledger (or an entry) whose prefix already
  differs from a bound is all on one side of it: ``prune`` skips such ledgers and entries, and
  each row is compared exactly.

``__publishTime``, ``__eventTime`` and ``__messageId`` are not pushed into ``latest``: there the
filter applies to the folded row, and filtering messages before the fold would change which row a
key gets.

Every filter is also handed back to Spark, which evaluates it again on what the source returns:
the source only has to return a superset of the matching rows, never exactly them, so a rounding
or a type this module reads differently from Spark can cost speed, never a row. (Spark's
``filterPushdown`` conf must be on for a Python source to get filters: ``compactmq.spark.register``
turns it on.)

What a pushed read saved is counted in ``STATS`` (``messages_read``: messages decoded by the
source; ``rows_returned``: rows it handed to Spark), per process, and logged per split at INFO.
"""

from __future__ import annotations

import collections
import datetime as _dt
import logging
from dataclasses import dataclass, replace

KEY = "__key"
PUBLISH_TIME = "__publishTime"
EVENT_TIME = "__eventTime"
MESSAGE_ID = "__messageId"
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_RANGE_OPS = ("EqualTo", "GreaterThan", "GreaterThanOrEqual", "LessThan", "LessThanOrEqual")

#: per process: messages the source decoded and rows it returned (tests and benchmarks read it)
STATS: collections.Counter = collections.Counter()
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pushed:
    """What the pushed filters allow (None: unbounded): keys; publish- and event-time windows in
    ms (``lo`` inclusive, ``hi`` exclusive); serialized message ids between ``id_lo`` and
    ``id_hi`` (both inclusive, compared as bytes)."""

    keys: frozenset | None = None
    time_lo: int | None = None
    time_hi: int | None = None
    event_lo: int | None = None
    event_hi: int | None = None
    id_lo: bytes | None = None
    id_hi: bytes | None = None

    def with_keys(self, keys) -> Pushed:
        keys = frozenset(k for k in keys if isinstance(k, str))
        return replace(self, keys=keys if self.keys is None else self.keys & keys)

    def with_time(self, lo: int | None, hi: int | None) -> Pushed:
        return replace(self, time_lo=_max(self.time_lo, lo), time_hi=_min(self.time_hi, hi))

    def with_event_time(self, lo: int | None, hi: int | None) -> Pushed:
        return replace(self, event_lo=_max(self.event_lo, lo), event_hi=_min(self.event_hi, hi))

    def with_ids(self, lo: bytes | None, hi: bytes | None) -> Pushed:
        return replace(self, id_lo=_max(self.id_lo, lo), id_hi=_min(self.id_hi, hi))

    @property
    def by_event_time(self) -> bool:
        return self.event_lo is not None or self.event_hi is not None

    @property
    def by_id(self) -> bool:
        return self.id_lo is not None or self.id_hi is not None

    @property
    def per_row(self) -> bool:
        """Whether rows are checked one by one (``row_mask``) beyond what the split bounds do."""
        return self.keys is not None or self.by_event_time or self.by_id


def _max(a, b):
    return b if a is None else a if b is None else max(a, b)


def _min(a, b):
    return b if a is None else a if b is None else min(a, b)


def _micros(value) -> int | None:
    """Microseconds since the epoch of an aware datetime (None for anything else)."""
    if isinstance(value, _dt.datetime) and value.tzinfo is not None:
        return (value - _EPOCH) // _dt.timedelta(microseconds=1)
    return None


def _time_bounds(name: str, micros: int) -> tuple[int | None, int | None]:
    """A window in ms holding every message whose ``ms * 1000`` satisfies ``name`` against
    ``micros`` (one ms of slack on each side: Spark checks exactly)."""
    ms = micros // 1000
    if name in ("GreaterThan", "GreaterThanOrEqual"):
        return ms - 1, None
    if name in ("LessThan", "LessThanOrEqual"):
        return None, ms + 2
    if name == "EqualTo":
        return ms - 1, ms + 2
    return None, None


def _id_bounds(name: str, value) -> tuple[bytes | None, bytes | None]:
    """Inclusive byte bounds holding every serialized id that satisfies ``name`` against ``value``."""
    if name == "In":
        values = [bytes(v) for v in value if isinstance(v, (bytes, bytearray))]
        if len(values) != len(value) or not values:
            return None, None
        return min(values), max(values)
    if not isinstance(value, (bytes, bytearray)):
        return None, None
    value = bytes(value)
    if name in ("GreaterThan", "GreaterThanOrEqual"):
        return value, None
    if name in ("LessThan", "LessThanOrEqual"):
        return None, value
    if name == "EqualTo":
        return value, value
    return None, None


def _pushable_keys(values) -> bool:
    """Keys the source can match: strings without U+FFFD (a key whose stored bytes are not UTF-8
    shows replacement characters in Spark; its bytes are not what the string encodes to)."""
    return all(isinstance(v, str) and "\ufffd" not in v for v in values if v is not None)


def push(filters, view: str) -> Pushed:
    """The ``Pushed`` of the conjuncts ``filters`` (Spark's ``pyspark.sql.datasource`` filters)."""
    pushed = Pushed()
    for f in filters:
        name = type(f).__name__
        column = tuple(getattr(f, "attribute", ()))
        value = getattr(f, "value", None)
        if column == (KEY,):
            if name == "EqualTo" and isinstance(value, str) and _pushable_keys([value]):
                pushed = pushed.with_keys([value])
            elif name == "In" and _pushable_keys(value):
                pushed = pushed.with_keys(value)
        elif view == "latest":
            continue
        elif column in ((PUBLISH_TIME,), (EVENT_TIME,)) and name in _RANGE_OPS:
            micros = _micros(value)
            if micros is not None:
                bounds = _time_bounds(name, micros)
                pushed = (
                    pushed.with_time(*bounds)
                    if column == (PUBLISH_TIME,)
                    else pushed.with_event_time(*bounds)
                )
        elif column == (MESSAGE_ID,) and (name in _RANGE_OPS or name == "In"):
            pushed = pushed.with_ids(*_id_bounds(name, value))
    return pushed


def time_window(opts, pushed: Pushed):
    """``opts`` with its startingTime / endingTime narrowed to the pushed window."""
    lo, hi = opts.starting_time, opts.ending_time
    if pushed.time_lo is not None:
        lo = pushed.time_lo if lo is None else max(lo, pushed.time_lo)
    if pushed.time_hi is not None:
        hi = pushed.time_hi if hi is None else min(hi, pushed.time_hi)
    return replace(opts, starting_time=lo, ending_time=hi)


# --- per row ----------------------------------------------------------------------------------


def row_mask(batch, pushed: Pushed):
    """The rows of an Arrow record batch (the source's schema) that may pass the pushed filters
    on keys, event times and message ids (a boolean array; None: all of them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    masks = []
    if pushed.keys is not None:
        wanted = pa.array(sorted(pushed.keys), pa.string())
        masks.append(pc.is_in(batch.column(KEY), value_set=wanted))
    if pushed.by_event_time:
        et = batch.column(EVENT_TIME)
        ms = pc.cast(et, pa.int64())  # microseconds
        if pushed.event_lo is not None:
            masks.append(pc.greater_equal(ms, pushed.event_lo * 1000))
        if pushed.event_hi is not None:
            masks.append(pc.less(ms, pushed.event_hi * 1000))
    if pushed.by_id:
        ids = batch.column(MESSAGE_ID)
        if pushed.id_lo is not None:
            masks.append(pc.greater_equal(ids, pa.scalar(pushed.id_lo, pa.binary())))
        if pushed.id_hi is not None:
            masks.append(pc.less_equal(ids, pa.scalar(pushed.id_hi, pa.binary())))
    if not masks:
        return None
    mask = masks[0]
    for m in masks[1:]:
        mask = pc.and_kleene(mask, m)
    return pc.fill_null(mask, False)


def filtered(batches, pushed: Pushed, what: str, read: list):
    """``batches`` with the rows ``row_mask`` drops taken out; counts and logs what it returned
    (``read[0]``: the messages the split decoded, filled in by the caller as it reads)."""
    returned = 0
    for batch in batches:
        mask = row_mask(batch, pushed) if pushed.per_row else None
        if mask is not None:
            batch = batch.filter(mask)
        returned += batch.num_rows
        if batch.num_rows:
            yield batch
    STATS["messages_read"] += read[0]
    STATS["rows_returned"] += returned
    STATS["splits"] += 1
    log.info("compactmq split %s: %d messages read, %d rows returned", what, read[0], returned)
