"""The Spark side of a compaction run: ``DataFrame -> DataFrame`` functions over a joint plan.

Every job computes a ``joint_plan.JointPlan``: a single topic's run is the joint plan of its one
plan (its own numbering, its own hashes), several topics compacted together (``multi``) are the
members of one; ``compact`` runs both phases of either, inside the job shell ``job.spark_job``.

Phase one reads rows ``(h1, h2, pos, flags[, et])`` -- a 128-bit key hash, the packed position,
tombstone/keyless flags -- produced by Python workers (``mapInArrow`` over one input row per
group, so each task parses its own ledger files) and finds the surviving position per key with
Spark's own operators:

* keep-latest: ``max((pos << 1) | tombstone)`` per key -- one long, so Spark plans a hash
  aggregate (DESIGN §6); a survivor is a maximum whose tombstone bit is 0. The workers hand
  these rows over packed, ``(h1, h2, p2)`` (``read_rows``). It is one aggregate,
  after the shuffle: the parsing tasks' combiner has done the partial aggregation already, so the
  session bypasses Spark's (``session.RUN_DEFAULTS``);
* keep-first / event-time: per key, the last tombstone (a window aggregate), then the first
  (resp. the newest event time, then latest) of the values after it;
* a user strategy: rows sorted by key within partitions, folded in Python workers.

Keys are grouped by a 128-bit hash (``entry_scan.hash_keys``; Kafka's cleaner groups by an MD5 of
the key for the same reason): for n distinct keys the chance that two share it is about
n^2 / 2^129 (1.5e-21 for a billion keys). A retained keyless message gets a group of its own (its
position stands in for the hash). For keep-latest each parsing task first drops the rows that a
later row of the same key in its own group supersedes (a map-side combiner, as Spark's partial
aggregation would), which cuts the rows handed to the JVM several-fold on skewed or long topics;
groups are few and large for that reason (``plan.build_groups``: a multiple of the cores, up to
8 M entries; at 10 M messages over 1 M keys two tasks hand the shuffle 2.0 M rows). Where keys
barely repeat the combiner gives up after a probe (``tasks.group_rows``), and the aggregate's
shuffle starts wide and is coalesced by adaptive execution to what the rows need, so that no
aggregate task holds more keys than fit its memory (``session.RUN_DEFAULTS``).

Phase two shuffles the surviving positions with their key hashes and flags (longs, never
payloads) to one task per group, which sorts them by position (numpy; cheaper than a Spark
sort); each task re-reads the records it copies from its own ledger files and writes a part
file, and beside it the part's rows of the view's key sidecar (``view_keys``), which the next
run reads instead of parsing the view.
"""

from __future__ import annotations

import numpy as np

from .. import entry_scan as es
from .. import tasks
from ..plan import COMPACTED, RunPlan
from .joint_plan import JointPlan, relabel, unsalt

_POS_SHIFT = es.ENTRY_BITS + es.BATCH_BITS
# larger than any packed position, so "tombstones from here" keeps none
_NEVER = 1 << (es.ORDINAL_BITS + _POS_SHIFT)


def row_schema(with_et: bool, packed: bool) -> str:
    """The Spark schema of phase-one rows (``tasks.rows_to_arrow``)."""
    if packed:
        return "h1 long, h2 long, p2 long"
    return "h1 long, h2 long, pos long, flags byte" + (", et long" if with_et else "")


def read_rows(
    spark, joint: JointPlan, counters=None, keyless_counters=None, packed=False, n_tasks=None, groups=None
):
    """Phase-one rows of every group of every plan of ``joint`` (of the joint groups ``groups``
    when given), parsed in Python workers: ``n_tasks`` tasks (default: one per group), each
    parsing a contiguous run of groups, each group with its own plan, its rows relabelled into
    the joint numbering (``joint_plan.relabel``). ``counters[i]`` (a Spark accumulator) adds up
    plan ``i``'s messages parsed, ``keyless_counters[i]`` its keyless messages retained (they
    all survive).

    ``packed`` (keep-latest): rows ``h1, h2, p2``, position and tombstone bit in one long
    (``(pos << 1) | tomb``), the one value keep-latest aggregates. Packed by the worker, the JVM
    converts three columns instead of four and projects nothing before the shuffle (given the
    expression inside the aggregate instead, Spark shuffled ``pos`` and ``tomb`` apart)."""
    plans, offsets, owners = joint.plans, joint.offsets, joint.owners
    with_et = joint.plan.strategy == "event-time"
    schema = row_schema(with_et, packed)

    def parse(batches):
        for batch in batches:
            for index in batch.column(0).to_pylist():
                i, local = owners[index if groups is None else groups[index]]
                stats: dict = {}
                for rows in tasks.group_rows(plans[i], local, stats):
                    yield tasks.rows_to_arrow(relabel(rows, i, offsets[i]), with_et, packed)
                for counts, key in ((counters, "messages"), (keyless_counters, "keyless")):
                    if counts is not None and counts[i] is not None:
                        counts[i].add(stats.get(key, 0))

    n = len(owners) if groups is None else len(groups)
    return spark.range(0, n, 1, min(n, n_tasks or n)).mapInArrow(parse, schema)


def with_key_hash(rows):
    """``h1, h2, pos, tomb[, et]``: the rows as the strategies consume them."""
    from pyspark.sql import functions as F

    return rows.select(
        "h1",
        "h2",
        "pos",
        (F.col("flags").bitwiseAND(F.lit(es.FLAG_TOMBSTONE)) != 0).alias("tomb"),
        *([F.col("et")] if "et" in rows.columns else []),
    )


def keep_latest(packed, drop_before: int = 0, tombstones_from=None):
    """Survivors ``pos`` of keep-latest over ``packed`` rows (``read_rows``): the last message
    per key, unless it is a tombstone (one at or after ``tombstones_from`` stays: tombstone
    retention) or it lies before ``drop_before`` (the key's time-to-live ran out); both are
    packed positions, see ``RunPlan``."""
    from pyspark.sql import functions as F

    # the expressions as SQL text (of integers this code formats): one round trip to the JVM
    # each, where building them column by column took a dozen (a run's fixed cost)
    live = "(p2 & 1) = 0"
    if tombstones_from is not None:
        live = f"({live} OR shiftright(p2, 1) >= {int(tombstones_from)})"
    if drop_before:
        live = f"{live} AND shiftright(p2, 1) >= {int(drop_before)}"
    kept = tombstones_from is not None
    return (
        packed.groupBy("h1", "h2")
        .agg(F.expr("max(p2) AS p2"))
        .where(live)
        .selectExpr("shiftright(p2, 1) AS pos", "h1", "h2", *(["p2 & 1 AS tomb"] if kept else []))
    )


def keep_latest_joint(packed, joint: JointPlan):
    """keep-latest over the joint ``packed`` rows, each plan with its own key TTL and tombstone
    cuts (a plan of its own: ``keep_latest`` with its cuts)."""
    from pyspark.sql import functions as F

    plans = joint.plans
    if len(plans) == 1:
        return keep_latest(packed, plans[0].drop_before, plans[0].tombstones_from)
    if all(p.drop_before == 0 and p.tombstones_from is None for p in plans):
        return keep_latest(packed)
    pos = F.shiftright("p2", 1)
    tomb = F.col("p2").bitwiseAND(F.lit(1)) == 1
    live = None
    for i, p in enumerate(plans):
        base = joint.base(i)
        keep_tomb = _NEVER if p.tombstones_from is None else p.tombstones_from + base
        drop_before = p.drop_before + base if p.drop_before else 0
        rule = (~tomb | (pos >= F.lit(int(keep_tomb)))) & (pos >= F.lit(int(drop_before)))
        live = (
            F.when(pos < F.lit(joint.end(i)), rule)
            if live is None
            else live.when(pos < F.lit(joint.end(i)), rule)
        )
    assert live is not None
    kept = any(p.tombstones_from is not None for p in plans)  # a tombstone may survive
    return (
        packed.groupBy("h1", "h2")
        .agg(F.max("p2").alias("p2"))
        .where(live.otherwise(False))
        .select(pos.alias("pos"), "h1", "h2", *tomb_column(kept))
    )


def tomb_column(kept: bool) -> list:
    """The survivors' ``tomb`` column, when tombstones may survive (``kept``: tombstone
    retention). Otherwise every survivor is a value and phase two takes the bits as zeros
    (``copy_part``) rather than have a column of zeros shuffled: 8 of a row's 40 bytes, 6 % of
    the survivors' compressed shuffle at 30 M keys (460 MB against 492)."""
    from pyspark.sql import functions as F

    return [F.col("p2").bitwiseAND(F.lit(1)).alias("tomb")] if kept else []


def _after_last_tombstone(keyed):
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("h1", "h2")
    last_tomb = F.max(F.when(F.col("tomb"), F.col("pos"))).over(w)
    return keyed.withColumn("t", last_tomb).where(
        ~F.col("tomb") & (F.col("pos") > F.coalesce("t", F.lit(-1)))
    )


def keep_first(keyed):
    """Survivors of keep-first (PIP-215): the first value after the key's last tombstone."""
    from pyspark.sql import functions as F

    return (
        _after_last_tombstone(keyed)
        .groupBy("h1", "h2")
        .agg(F.min("pos").alias("pos"))
        .select("pos", "h1", "h2")
    )


def event_time(keyed):
    """Survivors of event-time: after the last tombstone, the newest ``et``, then the latest."""
    from pyspark.sql import functions as F

    return (
        _after_last_tombstone(keyed)
        .groupBy("h1", "h2")
        .agg(F.max(F.struct("et", "pos")).alias("w"))
        .select(
            F.col("w.pos").alias("pos"),
            "h1",
            "h2",
            F.col("w.et").alias("et"),
        )
    )


def user_strategy(keyed, plan: RunPlan, strategy):
    """Survivors of a user strategy: rows of one key side by side, folded in Python workers."""

    def fold(batches):
        import pyarrow as pa

        cols = {"h1": [], "h2": [], "pos": [], "tomb": []}
        for b in batches:
            for name in cols:
                cols[name].append(b.column(name).to_numpy(zero_copy_only=False))
        if not cols["pos"]:
            return
        h1, h2, pos, tomb = (np.concatenate(cols[c]) for c in ("h1", "h2", "pos", "tomb"))
        flags = np.where(tomb, es.FLAG_TOMBSTONE, 0)
        out = tasks.fold_user(plan, strategy, h1, h2, pos, flags)
        yield pa.RecordBatch.from_arrays([pa.array(out, pa.int64())], names=["pos"])

    return keyed.repartition("h1", "h2").sortWithinPartitions("h1", "h2", "pos").mapInArrow(fold, "pos long")


def survivors(spark, joint: JointPlan, strategy, counters=None, keyless_counters=None, n_tasks=None):
    """Phase one: the (joint) packed positions of the surviving messages (``pos``); for the
    built-in strategies also their key hash (and tombstone bit where tombstones may survive,
    event time for event-time): what phase two writes into the new view's key sidecar
    (``view_keys``), so the next run need not parse the view."""
    name = joint.plan.strategy
    if name == "keep-latest":
        packed = read_rows(spark, joint, counters, keyless_counters, True, n_tasks)
        return keep_latest_joint(packed, joint)
    keyed = with_key_hash(read_rows(spark, joint, counters, keyless_counters, n_tasks=n_tasks))
    if name == "keep-first":
        return keep_first(keyed)
    if name == "event-time":
        return event_time(keyed)
    return user_strategy(keyed, joint.plan, strategy)


def compact(spark, joint: JointPlan, strategy, job, n_tasks=None) -> list[list[dict]]:
    """Both phases of ``joint`` in the Spark job ``job`` (``job.spark_job``: its counters, one
    pair per plan): the part descriptions of each plan, by group."""
    found = survivors(spark, joint, strategy, job.counters, job.keyless, n_tasks)
    return copy_survivors(found, joint, n_tasks=n_tasks)


def copy_survivors(
    survivors_df, joint: JointPlan, counters=None, keyless_counters=None, n_tasks=None
) -> list[list[dict]]:
    """Phase two: survivors to their group's task (``n_tasks`` tasks, default one per group;
    fewer take contiguous runs of groups), which copies each of its groups with its plan into a
    part file (``copy_joint``). Returns the part descriptions of each plan, by group.

    Rows with a ``kind`` column are a lookup run's (``compaction.lookup_run``, a plan of its
    own), routed already (a ``route`` column): an old group's task gets the positions superseded
    in it (and a marker row, so it runs at all) and retires them (``lookup_run.retire_group``,
    counting its live rows into ``counters`` and its retained keyless messages into
    ``keyless_counters``); a new group's task copies its survivors."""
    from pyspark.sql import functions as F

    n = max(1, len(joint.owners))
    routed = "route" in survivors_df.columns  # the rows come routed (``routes``)
    if routed:
        parts_n, route = n, F.col("route")
    else:
        # Hash partitioning by the group number would put several groups in one task (0 and 1
        # both land in partition 1 of 2), serialising phase two. Instead each group gets a key
        # that Spark's own hash partitioning sends to a partition of its own. The key is an
        # expression of the partitioning only: the shuffled rows are the survivors' columns,
        # nothing more, and the task finds each row's group from its position; nor does Spark
        # sort them (``gather_sorted``).
        parts_n = min(n, n_tasks or n)
        keys = packed_routes(partition_keys(survivors_df.sparkSession, parts_n), n)
        route = route_column(keys, joint.plan.group_of_ordinal())
    key_cols = key_columns(survivors_df)
    kinds = ["kind"] if "kind" in survivors_df.columns else []

    def copy(batches):
        import pyarrow as pa

        arrays = gather_sorted(batches, ["pos", *key_cols, *kinds])
        if arrays is None:
            return
        out = copy_joint(joint, arrays, key_cols, counters, keyless_counters)
        yield pa.RecordBatch.from_pylist(out, schema=part_schema(("plan", pa.int32())))

    columns = ["pos", *key_cols, *kinds, *(["route"] if routed else [])]
    rows = survivors_df.select(*columns).repartition(parts_n, route)
    parts: list[list[dict]] = [[] for _ in joint.plans]
    for d in collect_parts(rows.mapInArrow(copy, "plan int, " + PART_DDL)):
        parts[d.pop("plan")].append(d)
    return parts


def copy_joint(
    joint: JointPlan, arrays: dict, key_cols: list[str], counters=None, keyless_counters=None
) -> list:
    """Phase two of one task's rows (``arrays``: numpy columns sorted by joint position) over the
    plans of ``joint``: each plan's rows -- a contiguous run, its positions being a range -- are
    turned back into the plan's own numbering (positions; key hashes, ``joint_plan.unsalt``)
    and copied by ``copy_groups``. Each part description says its ``plan``."""
    pos = arrays["pos"]
    out = []
    for i, plan in enumerate(joint.plans):
        lo, hi = np.searchsorted(pos, [joint.base(i), joint.end(i)]).tolist()
        if lo == hi:
            continue
        mine = {c: a[lo:hi] for c, a in arrays.items()}
        if i:
            mine["pos"] = mine["pos"] - np.int64(joint.base(i))
            if "h1" in mine:
                mine["h1"] = unsalt(mine["h1"], mine["h2"], mine["pos"], i)
        counter = None if counters is None else counters[i]
        keyless = None if keyless_counters is None else keyless_counters[i]
        out.extend(dict(part, plan=i) for part in copy_groups(plan, mine, key_cols, counter, keyless))
    return out


def collect_parts(parts_df) -> list[dict]:
    """The part descriptions (``PART_DDL``) the phase-two tasks of ``parts_df`` report, by group.
    Collected as Arrow: ``collect`` would turn every row into a Python object in the JVM, whose
    cost is the binary drops and masks of an incremental run over many batches (about 0.7 JVM
    CPU-s of a 1 s lookup run at 10 M batched messages)."""
    return sorted(parts_df.toArrow().to_pylist(), key=lambda d: d["group"])


def copy_groups(plan: RunPlan, arrays: dict, key_cols: list[str], counter=None, keyless_counter=None) -> list:
    """Phase two of the groups whose rows ``arrays`` holds (numpy columns sorted by ``pos``): a
    part description per group. With a ``kind`` column (a lookup run): an old group's positions
    superseded are retired (``lookup_run.retire_group``: its live rows counted into ``counter``, its
    retained keyless messages into ``keyless_counter``), a new group's survivors copied."""
    from .. import lookup_run

    kinds = "kind" in arrays
    pos = arrays["pos"]
    grp = np.asarray(plan.group_of_ordinal(), np.int64)[pos >> _POS_SHIFT]
    out = []
    for g, lo, hi in runs_of(grp):
        m = slice(lo, hi)
        if kinds and plan.segments[plan.groups[g][0]].kind == COMPACTED:
            stats: dict = {}
            superseded = pos[m][arrays["kind"][m] == lookup_run.SUPERSEDED]
            out.append(lookup_run.retire_group(plan, g, superseded, stats))
            if counter is not None:
                counter.add(stats.get("messages", 0))
            if keyless_counter is not None:
                keyless_counter.add(stats.get("keyless", 0))
            continue
        if kinds:  # a lookup run's new group: its survivors (no marker reaches it)
            m = lo + np.flatnonzero(arrays["kind"][m] == lookup_run.SURVIVOR)
        out.append(copy_part(plan, g, pos[m], arrays, m, key_cols))
    return out


def runs_of(values: np.ndarray) -> list[tuple[int, int, int]]:
    """``(value, start, end)`` of each run of equal values of a sorted array (a group's rows are
    one run once sorted by position: groups are ranges of positions)."""
    if not len(values):
        return []
    cuts = np.flatnonzero(values[1:] != values[:-1]) + 1
    starts = [0, *cuts.tolist()]
    ends = [*cuts.tolist(), len(values)]
    return [(int(values[a]), a, b) for a, b in zip(starts, ends)]


#: what a phase-two task reports of each part it wrote (Spark DDL and Arrow schema alike)
PART_DDL = (
    "group int, path string, entries long, messages long, tombstones long, keys string, "
    "dropped binary, masks binary, ledgers binary"
)


def part_schema(*leading):
    """The Arrow schema of ``PART_DDL``, after ``leading`` (name, type) fields."""
    import pyarrow as pa

    fields = [("group", pa.int32()), ("path", pa.string()), ("entries", pa.int64())]
    fields += [("messages", pa.int64()), ("tombstones", pa.int64()), ("keys", pa.string())]
    fields += [("dropped", pa.binary())]  # entries of the previous view an incremental run drops
    fields += [("masks", pa.binary())]  # and the masks it puts on old batches (``tasks.encode_masks``)
    fields += [("ledgers", pa.binary())]  # entries written per source ledger (``previous_view.part_counts``)
    return pa.schema([*leading, *fields])


def key_columns(survivors_df) -> list[str]:
    """The survivors' key columns phase two writes to the view's key sidecar (none for a user
    strategy, whose survivors are positions only)."""
    return [c for c in ("h1", "h2", "tomb", "et") if c in survivors_df.columns]


def gather_sorted(batches, cols: list[str]):
    """The Arrow batches of one phase-two task as numpy columns sorted by ``pos``, or None when
    the task got none. Sorting here (``entry_scan.position_order``) is cheaper than asking Spark to sort the
    rows before handing them over."""
    parts: dict = {c: [] for c in cols}
    for b in batches:
        for c in cols:
            parts[c].append(b.column(c).to_numpy(zero_copy_only=False))
    if not parts["pos"]:
        return None
    arrays = {c: np.concatenate(v) for c, v in parts.items()}
    order = es.position_order(arrays["pos"])
    return {c: a[order] for c, a in arrays.items()}


def copy_part(plan: RunPlan, group: int, positions, arrays: dict, m, key_cols: list[str]) -> dict:
    """Copy one group's survivors (``arrays[...][m]``, positions and key hashes in ``plan``'s
    own numbering) into its part file, with its key sidecar when there are key columns, and
    count the tombstones it keeps (only keep-latest with tombstone retention keeps any)."""
    keys = None
    if "h1" in key_cols:
        keys = {c: arrays[c][m] for c in key_cols}
        if "tomb" not in keys:  # no survivor can be a tombstone (``tomb_column``)
            keys["tomb"] = np.zeros(len(positions), np.int64)
    part = tasks.copy_group(plan, group, positions, keys)
    part.setdefault("dropped", b"")
    part.setdefault("masks", b"")
    part["tombstones"] = int(arrays["tomb"][m].sum()) if "tomb" in arrays else 0
    return part


def packed_routes(keys: list[int], n: int) -> list[int]:
    """The partition key of each of ``n`` groups when ``len(keys)`` tasks take them in
    contiguous runs (as ``spark.range`` hands phase one its groups)."""
    count = max(1, len(keys))
    return [keys[g * count // n] for g in range(n)]


def route_column(keys: list[int], table: list[int]):
    """The phase-two route of a survivor (``copy_survivors``): the partition key of the group of
    its segment, ``keys[table[ordinal]]`` (with ``keys`` the identity: its group). As SQL text
    (integers this code formats): one round trip to the JVM, where a literal column per segment
    took several each."""
    from pyspark.sql import functions as F

    literals = ", ".join(str(int(keys[g])) for g in table)
    return F.expr(f"element_at(array({literals}), CAST(shiftright(pos, {_POS_SHIFT}) + 1 AS INT))")


def routes(plan: RunPlan, keys: list[int], pos: np.ndarray) -> np.ndarray:
    """The phase-two route of packed positions (``copy_survivors``), computed where the rows are
    made (a Python task) rather than by a Spark expression over literal arrays of every segment;
    ``keys``: ``partition_keys`` of the group count."""
    table = np.asarray(keys, np.int32)[np.asarray(plan.group_of_ordinal(), np.int64)]
    return table[np.asarray(pos, np.int64) >> _POS_SHIFT] if len(pos) else np.zeros(0, np.int32)


#: ``partition_keys`` answers by partition count: Spark's partitioning hash is fixed for a given
#: Spark version, so asking once per process saves every later run a small Spark job
_partition_keys: dict[int, list[int]] = {}


def partition_keys(spark, n: int) -> list[int]:
    """For each partition p < n, an int key that ``repartition(n, key)`` sends to partition p
    (found by asking Spark's own hash, so it holds whatever the hash function; remembered per n)."""
    known = _partition_keys.get(n)
    if known is not None:
        return known
    from pyspark.sql import functions as F

    k = F.col("id").cast("int")
    rows = spark.range(0, 64 * n + 64).select(k.alias("k"), F.pmod(F.hash(k), F.lit(n)).alias("p")).collect()
    found: dict[int, int] = {}
    for r in rows:
        found.setdefault(r.p, r.k)
    if len(found) == n:  # only a complete answer is remembered (a guess stays a guess)
        _partition_keys[n] = [found[p] for p in range(n)]
    return [found.get(p, p) for p in range(n)]
