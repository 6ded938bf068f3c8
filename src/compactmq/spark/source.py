"""The ``compactmq`` data source: topics as tables through Spark's Python Data Source API.

``CompactMQDataSource`` is what ``compactmq.spark.register(spark)`` registers (its subclass
``CompactMQPushdownDataSource``, whose reader takes pushed filters, by default: ``pushdown``). A
batch read plans on the driver (``plan_read``: topic partitions, their layout, the splits of
``plan``) and reads each split in a Python worker, which turns it into Arrow record batches:
straight from the entries for raw and compacted splits, read from the files or as whole entries
through the broker (``entry_columns``, ``arrow_columns``, ``broker_entries``), through one
``Message`` per message otherwise (``messages``, ``values``). Pushed filters (``pushdown``) shrink
the plan (``prune``) and the rows returned.
Which backend plans and reads is decided once from the options: the data directory when ``path``
names one this process can see (the fast path), else the broker (``service.url``).

The Python Data Source API reruns the reader for every scan of a plan, so a DataFrame used twice is
read twice (cache it). Spark 4.3 gives a Python reader no required columns (its
``PythonScanBuilder`` implements ``SupportsPushDownFilters`` only), so every row of every column a
read returns is converted by the JVM; a user who needs fewer names them with
``spark.read.schema("value binary, __key string")``: the reader builds only those.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ..errors import CompactMQError, InvalidConfiguration
from . import plan as P
from .options import ReadOptions, parse_read_options
from .pushdown import Pushed, filtered, push, time_window
from .values import (
    TopicSchema,
    ValueDecoder,
    arrow_schema,
    check_columns,
    spark_schema,
    to_record_batch,
)

FORMAT = "compactmq"
BATCH_ROWS = 8192  # rows per record batch of the row path
# rows per record batch of the columnar path (a chunk's rows, mostly: chunks are bounded in bytes,
# ``direct.CHUNK_BYTES``): each batch costs the worker a few dozen numpy calls and the JVM a
# batch set-up, so larger ones cost less per row (1 M rows: 0.77 -> 0.57 worker CPU-s, 8192 -> 131072)
COLUMN_BATCH_ROWS = 65536


class DataLoss(CompactMQError):
    """A requested offset is no longer in the topic (retention removed it) and failOnDataLoss=true."""


class SplitPartition(InputPartition):
    """A Spark input partition carrying one ``plan.Split`` and the backend arguments to read it
    (``partitions()`` and ``read()`` run in different Python processes: the reader object is
    pickled before planning, so everything a task needs travels in its partition)."""

    def __init__(self, split, args: tuple = ()):
        super().__init__((split, args))


def open_backend(opts: ReadOptions):
    """The backend that plans this read (close it after planning)."""
    import os

    if opts.data_dir and opts.direct and os.path.exists(os.path.join(opts.data_dir, "metadata.db")):
        from .direct import DirectBackend

        return DirectBackend(opts.data_dir)
    if not opts.service_url:
        raise InvalidConfiguration(
            f"path {opts.data_dir!r} is not a readable compactmq data directory and no service.url is set"
        )
    from .broker import BrokerBackend

    return BrokerBackend(opts.service_url, opts.admin_url, opts.client)


def is_direct(backend) -> bool:
    return type(backend).__name__ == "DirectBackend"


def topic_schema(opts: ReadOptions) -> TopicSchema:
    backend = open_backend(opts)
    try:
        parts = backend.partitions(opts.topics, opts.topics_pattern)
        for topic, _ in parts:
            s = backend.schema(topic)
            if s.type:
                return s
        return TopicSchema()
    finally:
        backend.close()


def _bounds(opts: ReadOptions, layout: P.Layout, base_name: str):
    """(start, end) ids of one partition's range; DataLoss per failOnDataLoss."""
    start = opts.topic_offset("start", layout.topic, base_name)
    end = opts.topic_offset("end", layout.topic, base_name)
    after_last = (layout.last[0], layout.last[1] + 1, -1) if layout.last else P.MIN_ID
    if start == "earliest":
        start = P.MIN_ID
    elif start == "latest":
        start = after_last
    elif layout.first is not None and tuple(start[:2]) < tuple(layout.first) and opts.view == "raw":
        if opts.fail_on_data_loss:
            raise DataLoss(
                f"{layout.topic}: startingOffsets {start[0]}:{start[1]} is before the first retained "
                f"message {layout.first[0]}:{layout.first[1]} (set failOnDataLoss=false to skip)"
            )
        start = P.MIN_ID
    if end == "latest":
        end = after_last
    return tuple(start), tuple(end)


def plan_read(
    opts: ReadOptions, backend=None, ranges: dict | None = None, pushed: Pushed | None = None
) -> list:
    """The splits of a batch read (or of one micro-batch, with ``ranges`` = {topic: (start, end)});
    with ``pushed`` filters, a ``latest`` tail keeps only the pushed keys, and the direct path
    plans only what the filters may need (``prune``)."""
    own = backend is None
    backend = backend or open_backend(opts)
    try:
        return _plan(opts, backend, ranges, pushed or Pushed())
    finally:
        if own:
            backend.close()


def _plan(opts: ReadOptions, backend, ranges: dict | None, pushed: Pushed) -> list:
    from ..naming import TopicName

    direct = is_direct(backend)
    splits: list = []
    for topic, index in backend.partitions(opts.topics, opts.topics_pattern):
        layout = backend.layout(topic, index, with_view=opts.view != "raw")
        if ranges is not None:
            if topic not in ranges:
                continue
            start, end = ranges[topic]
        else:
            start, end = _bounds(opts, layout, str(TopicName.parse(topic).partitioned_base))
        if start >= end:
            continue
        base = P.Split(
            topic,
            index,
            "",
            start_id=start,
            end_id=end,
            start_time=opts.starting_time,
            end_time=opts.ending_time,
            view=opts.view,
        )
        splits.extend(_plan_partition(opts, backend, layout, base, direct, pushed))
    return (
        P.balance(splits, opts.min_partitions, opts.max_records_per_partition)
        if opts.view != "latest"
        else _balance_latest(splits, opts)
    )


def _balance_latest(splits: list, opts: ReadOptions) -> list:
    # the tail split checks keys against the compacted splits as planned: cut those, keep the tail whole
    compacted = [s for s in splits if s.kind != "tail"]
    cut = P.balance(compacted, opts.min_partitions, opts.max_records_per_partition)
    out = list(cut)
    for s in splits:
        if s.kind == "tail":
            out.append(replace(s, parts=tuple(c for c in cut if c.topic == s.topic)))
    return out


def _with_paths(backend, splits: list, direct: bool) -> list:
    if not direct:
        return splits
    return [
        replace(s, path=backend.ledger_path(s.topic, s.ledger_id)) if s.kind == "live" else s for s in splits
    ]


def _live(backend, layout: P.Layout, after, base: P.Split, direct: bool, pushed: Pushed) -> list:
    from . import prune

    live = _with_paths(backend, P.live_splits(layout, after, base.start_id, base.end_id, base), direct)
    return prune.live(live, pushed) if direct else live


def _compacted(backend, layout: P.Layout, base: P.Split, direct: bool, pushed: Pushed) -> list:
    """The compacted splits, pruned: by message id, and to the entries of the pushed keys when
    the view's key index can name them (``prune.key_entries``)."""
    from . import prune

    splits = prune.compacted(P.compacted_splits(layout, base.start_id, base.end_id, base), pushed)
    view = layout.view
    if direct and pushed.keys is not None and view is not None and view.path is not None and splits:
        indexes = prune.key_entries(backend.storage, layout.topic, view.path, pushed.keys)
        if indexes is not None:
            return prune.restrict_compacted(splits, indexes)
    return splits


def _plan_partition(
    opts: ReadOptions, backend, layout: P.Layout, base: P.Split, direct: bool, pushed: Pushed
) -> list:
    keys = pushed.keys
    start, end = base.start_id, base.end_id
    if not direct and not layout.ledgers:  # broker without admin.url: one reader over the whole range
        if layout.last is None:
            return []
        tail = None
        if opts.view == "latest":
            tail = P.LatestTail({}, (), "keep-latest", opts.include_tombstones, False)
        return [replace(base, kind="view", latest=tail)]
    view = layout.view
    horizon = view.horizon if view is not None else None
    if opts.view == "raw" or horizon is None:
        live = _live(backend, layout, None, base, direct, pushed)
        if opts.view != "latest":
            return live
        compacted_end = start
    else:
        live = _live(backend, layout, horizon, base, direct, pushed)
        compacted_end = min(end, (horizon[0], horizon[1] + 1, -1))
    compacted = (
        _compacted(backend, layout, replace(base, end_id=compacted_end), direct, pushed)
        if compacted_end > start
        else []
    )
    if opts.view == "compacted":
        return compacted + live
    # latest: the tail after the horizon is folded on the driver and travels with every split; the
    # topic's strategy policy is checked here, before anything is read or imported
    from . import compacted_view

    strategy = compacted_view.checked_strategy(view.strategy if view else None, opts.strategy_classes)
    messages = []
    for s in live:
        messages.extend(with_keys(P.bounded(read_messages(s, backend_args(backend)), s), keys))
    tail = P.build_tail(
        messages,
        strategy,
        opts.include_tombstones,
        view.retain_null_key if view else False,
    )
    compacted = [replace(s, latest=tail) for s in compacted]
    return compacted + [replace(base, kind="tail", latest=tail, parts=tuple(compacted))]


def backend_args(backend, opts: ReadOptions | None = None) -> tuple:
    """What a worker needs to read a split: ("direct",) or ("broker", service_url, client options);
    ("direct", "rows") when the ``columnar=false`` option asks for the row path (see ``columnar``)."""
    if is_direct(backend):
        return ("direct",) if opts is None or opts.columnar else ("direct", "rows")
    columns = "columns" if opts is None or opts.columnar else "rows"
    return ("broker", backend.service_url, backend.client_options, columns)


def read_messages(split: P.Split, args: tuple) -> Iterator:
    if args[0] == "direct":
        from .direct import read_split

        return read_split(split)
    from .broker import read_split

    return read_split(split, args[1], args[2])


def with_keys(messages, keys: frozenset | None):
    """The messages with one of ``keys`` (all when None). A view's row for a key depends on that
    key's messages only (``latest`` folds per key), so dropping the others first is exact."""
    return messages if keys is None else (m for m in messages if m.key in keys)


def split_rows(split: P.Split, args: tuple, keys: frozenset | None = None) -> Iterator:
    """``(Message, deleted)`` rows of one split, views and bounds applied (and ``keys``)."""
    if split.kind == "tail":
        tail = split.latest
        from . import compacted_view

        known: set = set()
        if not compacted_view.reducible(compacted_view.strategy(tail.strategy)):
            for part in split.parts:
                for m in with_keys(P.bounded(read_messages(part, args), part), keys):
                    if m.key in tail.by_key:
                        known.add(m.key)
        return P.resolve_tail(tail, known)
    messages = with_keys(P.bounded(read_messages(split, args), split), keys)
    if split.kind == "view" and split.latest is not None:
        t = split.latest
        return P.fold_all(messages, t.strategy, t.include_tombstones, t.retain_null_key)
    if split.latest is not None:
        return P.resolve_latest(messages, split.latest)
    return ((m, False) for m in messages)


def record_batches(rows: Iterator, topic: str, decoder: ValueDecoder, pa_schema) -> Iterator:
    chunk: list = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= BATCH_ROWS:
            yield to_record_batch(chunk, topic, decoder, pa_schema)
            chunk = []
    if chunk:
        yield to_record_batch(chunk, topic, decoder, pa_schema)


class CompactMQReader(DataSourceReader):
    def __init__(self, opts: ReadOptions, schema, topic_schema_: TopicSchema):
        self.opts = opts
        self.schema = schema
        self.topic_schema = topic_schema_
        self.pushed = Pushed()

    def partitions(self):
        opts = time_window(self.opts, self.pushed)
        backend = open_backend(opts)
        try:
            splits = plan_read(opts, backend, pushed=self.pushed)
            args = backend_args(backend, opts)
        finally:
            backend.close()
        return [SplitPartition(s, args) for s in splits] or [SplitPartition(None)]

    def read(self, partition):
        split, args = partition.value
        if split is None:
            return
        yield from read_split_batches(split, args, self.schema, self.topic_schema, self.pushed)


class CompactMQFilteringReader(CompactMQReader):
    """The reader with ``pushFilters`` (``pushdown``): Spark asks for it only when its conf
    ``spark.sql.python.filterPushdown.enabled`` is on, and refuses a reader that has it otherwise,
    hence a class of its own."""

    def pushFilters(self, filters):
        self.pushed = push(filters, self.opts.view)
        return filters  # all of them: Spark checks every row again (see ``pushdown``)


def columnar(split: P.Split, args: tuple) -> bool:
    """Whether a split is read as columns (``entry_columns``): raw and compacted splits, from the
    files or as whole entries through the broker (``broker_entries``); ``latest`` folds and a
    broker read without ``admin.url`` build rows. The ``columnar=false`` option reads everything
    as rows (the previous paths: benchmarks and parity tests)."""
    if split.kind not in ("live", "compacted") or split.latest is not None:
        return False
    if args[0] == "direct":
        return "rows" not in args[1:]
    return len(args) > 3 and args[3] == "columns"


def read_split_batches(
    split, args, schema, topic_schema_: TopicSchema, pushed: Pushed | None = None
) -> Iterator:
    """Arrow batches of one split; with ``pushed`` filters, without the rows they rule out
    (``pushdown.row_mask``; the source's counts in ``pushdown.STATS``)."""
    pushed = pushed or Pushed()
    keys = pushed.keys
    pa_schema = arrow_schema(schema)
    value_fields = [f.name for f in schema.fields if not f.name.startswith("__")]
    decoder = ValueDecoder(topic_schema_, value_fields)
    read = [0]  # messages decoded, counted as they are read
    what = f"{split.topic} {split.kind} {split.ledger_id}:{split.lo}..{split.hi}"
    with_props = "__messageProperties" in schema.fieldNames()
    chunks = _column_chunks(split, args, with_props) if columnar(split, args) else None
    if chunks is not None:
        from .arrow_columns import record_batches as column_batches

        def counted_chunks():
            for cols in chunks:
                read[0] += len(cols)
                yield cols

        batches = column_batches(
            counted_chunks(), split.topic, split.partition, decoder, pa_schema, COLUMN_BATCH_ROWS, keys
        )
        yield from filtered(batches, pushed, what, read)
        return
    rows = _counted(split_rows(split, args, keys), read)
    if keys is not None:  # the tail's own keys and the keyless messages it keeps
        rows = (row for row in rows if row[0].key in keys)
    yield from filtered(record_batches(rows, split.topic, decoder, pa_schema), pushed, what, read)


def _column_chunks(split, args, properties: bool = True):
    """``MessageColumns`` of a split read as columns: the files, or whole entries through the
    broker (``broker_entries``); None when the broker connection needs the official client.
    ``properties=False``: the read returns no ``__messageProperties``, so none are parsed."""
    if args[0] == "direct":
        from .direct import read_split_columns

        return read_split_columns(split, properties)
    from . import broker_entries

    try:
        reader = broker_entries.open_reader(split, args[1], args[2])
    except broker_entries.Unsupported:
        return None
    return broker_entries.read_split_columns(reader, split, properties)


def _counted(rows: Iterator, read: list) -> Iterator:
    for row in rows:
        read[0] += 1
        yield row


class CompactMQDataSource(DataSource):
    """``spark.read.format("compactmq")`` / ``readStream`` / ``write`` / ``writeStream``."""

    pushdown = False  # batch reads take pushed filters (``CompactMQPushdownDataSource``)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _read_options(self, streaming: bool = False) -> ReadOptions:
        return parse_read_options(self.options, streaming=streaming)

    def schema(self):
        if not hasattr(self, "_topic_schema"):
            self._topic_schema = topic_schema(self._read_options())
        return spark_schema(self._topic_schema)

    def _schema_info(self) -> TopicSchema:
        if not hasattr(self, "_topic_schema"):
            self._topic_schema = topic_schema(self._read_options())
        return self._topic_schema

    def reader(self, schema):
        """The batch reader for ``schema``: the source's own, or one the user gave with
        ``spark.read.schema(...)`` naming some of its columns (``values.check_columns``), of
        which only those are built -- the way to prune columns on a Spark whose Python Data
        Source API passes no required columns to the reader (4.3 does not)."""
        info = self._schema_info()
        check_columns(schema, info)
        cls = CompactMQFilteringReader if self.pushdown else CompactMQReader
        return cls(self._read_options(), schema, info)

    def streamReader(self, schema):
        from .stream import CompactMQStreamReader

        info = self._schema_info()
        check_columns(schema, info)
        return CompactMQStreamReader(self._read_options(streaming=True), schema, info)

    def writer(self, schema, overwrite: bool):
        from .writer import CompactMQWriter

        return CompactMQWriter(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from .writer import CompactMQStreamWriter

        return CompactMQStreamWriter(self.options, schema, overwrite)


class CompactMQPushdownDataSource(CompactMQDataSource):
    """The format with filter pushdown on (what ``register`` registers by default)."""

    pushdown = True
