"""Several plans in one Spark job: a joint plan, and how its members are kept apart.

Every compaction job on Spark runs a ``JointPlan``: the partitions of a partitioned topic, or the
topics due at one check, are its members (``multi``), and a single topic's run is a joint plan of
one member, so that one computation (``pipeline``) serves both. A plan of one member IS its plan:
positions and key hashes are its own (the first member's salt is 0 and its offset 0), and the
joint ``plan`` is the member's ``RunPlan`` itself.

Keeping the partitions apart in one job
---------------------------------------
* **Positions.** The plans' segments are renumbered into one list: plan ``i``'s ordinals are
  offset by the segments of the plans before it, so a packed position names one message of one
  partition and positions of different partitions never meet (``JointPlan.offsets``).
* **Keys.** Phase one groups by the 128-bit key hash; the same key in two partitions must not
  merge. Each parsing task XORs ``h1`` of a keyed row with a salt of its plan (``_salt``), so
  the two hashes of one key in different partitions differ, and two different keys meet only
  with the probability of any 128-bit collision. A retained keyless row keeps its rule: its
  (now joint) position stands in for the hash.
* **Per-partition cuts.** The key TTL and the tombstone retention (``RunPlan.drop_before``,
  ``tombstones_from``) are packed positions of each plan; the joint keep-latest applies each
  plan's own cuts to the keys of its range of positions.
* Phase one parses and phase two copies each group with its own plan (``tasks.group_rows``,
  ``tasks.copy_group``), so per-partition settings (keyless messages, task probes, the object
  store prefix of the new ledger, and whether the run extends the partition's chain of segments
  or writes it fresh, ``compaction.chain``) stay per partition: each partition's view is a chain
  of its own, extended by the joint job exactly as by a run of its own. Plans that cannot share an aggregation
  (another strategy by topic policy) run as a second job of the same joint run.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from ... import errors
from .. import entry_scan as es
from .. import message_rows as mr
from ..plan import RunPlan

_POS_SHIFT = es.ENTRY_BITS + es.BATCH_BITS


def _salt(index: int) -> int:
    """A 64-bit salt per plan (0 for the first): Weyl sequence of the golden ratio, signed."""
    value = (index * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= 1 << 63 else value


@dataclasses.dataclass
class JointPlan:
    """The plans of one job, side by side. ``plan`` is a ``RunPlan`` over all their segments
    (renumbered) and groups (global numbers): what the shared pipeline functions, the user
    strategy's message loader and the progress poller read."""

    plans: list[RunPlan]
    offsets: list[int]  # ordinal offset of each plan's segments
    owners: list[tuple[int, int]]  # global group -> (plan index, the plan's own group number)
    plan: RunPlan

    @staticmethod
    def of(plans: Sequence[RunPlan]) -> "JointPlan":
        if not plans:
            raise ValueError("a joint plan needs at least one plan")
        if len(plans) == 1:  # a plan of its own: its numbering, its hashes, itself
            (only,) = plans
            _check_ordinals(len(only.segments))
            return JointPlan([only], [0], [(0, g) for g in range(len(only.groups))], only)
        segments, groups, offsets, owners = [], [], [], []
        for i, p in enumerate(plans):
            offset = len(segments)
            offsets.append(offset)
            segments.extend(dataclasses.replace(s, ordinal=s.ordinal + offset) for s in p.segments)
            for g, ords in enumerate(p.groups):
                groups.append([o + offset for o in ords])
                owners.append((i, g))
        _check_ordinals(len(segments))
        first = plans[0]
        joint = RunPlan(
            topic=", ".join(p.topic for p in plans),
            segments=segments,
            groups=groups,
            run_dir="",
            strategy=first.strategy,
            strategy_class=first.strategy_class,
            estimated_entries=sum(p.estimated_entries for p in plans),
        )
        return JointPlan(list(plans), offsets, owners, joint)

    def base(self, i: int) -> int:
        """The smallest joint packed position of plan ``i``."""
        return self.offsets[i] << _POS_SHIFT

    def end(self, i: int) -> int:
        """One past the largest joint packed position of plan ``i``."""
        return (self.offsets[i] + len(self.plans[i].segments)) << _POS_SHIFT


def _check_ordinals(segments: int) -> None:
    if segments > es.MAX_ORDINAL + 1:
        raise errors.CompactionError(f"{segments} ledger segments are too many for one compaction job")


def relabel(rows: mr.Rows, index: int, offset: int) -> mr.Rows:
    """Rows of plan ``index`` in the joint job: positions offset, key hashes salted (the first
    plan's rows are their own: offset 0, salt 0, and a keyless row's hash is its position)."""
    if not index and not offset:
        return rows
    pos = rows.pos + np.int64(offset << _POS_SHIFT) if offset else rows.pos
    keyless = (rows.flags & es.FLAG_KEYLESS) != 0
    h1 = np.where(keyless, pos, rows.h1 ^ np.int64(_salt(index)))
    return mr.Rows(h1, rows.h2, pos, rows.flags, rows.event_time)


def unsalt(h1: np.ndarray, h2: np.ndarray, local_pos: np.ndarray, index: int) -> np.ndarray:
    """``relabel`` undone on survivors, for the view's key sidecar: a keyed row's own hash, a
    retained keyless row's own (plan-local) position. The first plan's are their own."""
    if not index:
        return np.asarray(h1, np.int64)
    keyless = np.asarray(h2, np.int64) == es.KEYLESS_MARK
    return np.where(keyless, local_pos, np.asarray(h1, np.int64) ^ np.int64(_salt(index)))


__all__ = ["JointPlan", "relabel", "unsalt"]
