"""A tiny reference compactor: the semantics of DESIGN §2 in plain Python, obviously correct.

It decodes entries with pulsar_pb2 (not the compaction scanner), keeps its compacted ledger as a
list of decoded entries, and folds each key in id order. It knows nothing of Spark, hashes,
packed positions or file formats. The parity test drives it and the real service with the same
history and requires the same compacted view.
"""

from __future__ import annotations

from . import entries as E

TOMBSTONE = b""


def keep_left(strategy: str, prev, cur) -> bool:
    """prev/cur: (id, key, payload, event_time)."""
    if strategy == "keep-latest":
        return False
    if strategy == "keep-first":
        return True
    if strategy == "event-time":
        return prev[3] > cur[3]
    if strategy == "longest":
        return len(prev[2]) > len(cur[2])
    raise ValueError(strategy)


class ReferenceCompactor:
    def __init__(self, strategy="keep-latest", retain_null_key=False, retention_mode="retention-bounded"):
        self.strategy = strategy
        # keep-latest only: a key whose last message has an id below ``drop_before`` leaves the
        # view (key TTL); a tombstone with an id at or above ``tombstones_from`` stays in it
        self.drop_before = None
        self.tombstones_from = None
        self.retain_null_key = retain_null_key
        self.retention_mode = retention_mode
        self.compacted = []  # [(position, [(batch_index, key, payload, event_time, compacted_out)])]
        self.horizon = None

    def compact(self, entries, first_position):
        """``entries``: every ``(position, bytes)`` the topic holds now; ``first_position`` its first."""
        if self.horizon is None and not self.compacted and not entries:
            return
        previous = self.compacted
        if self.retention_mode == "retention-bounded":
            previous = [(p, m) for p, m in previous if first_position is not None and p >= first_position]
        after = [(p, blob) for p, blob in entries if self.horizon is None or p > self.horizon]
        new = []
        for p, blob in after:
            md, msgs = E.decode(blob)
            if md.HasField("marker_type"):
                continue
            new.append((p, msgs))
        inputs = previous + new
        # fold every key in id order
        state = {}
        last = {}  # key -> (id, is a tombstone) of its last message
        survivors = set()
        for p, msgs in inputs:
            for bidx, key, payload, et, out in msgs:
                if out:
                    continue
                mid = (p, bidx)
                if key is None:  # a retained keyless message lives as long as a key would
                    if self.retain_null_key and (self.drop_before is None or p >= self.drop_before):
                        survivors.add(mid)
                    continue
                cur = (mid, key, payload, et)
                last[key] = (mid, payload == TOMBSTONE)
                if payload == TOMBSTONE:
                    state.pop(key, None)
                elif key not in state or not keep_left(self.strategy, state[key], cur):
                    state[key] = cur
        if self.drop_before is None and self.tombstones_from is None:
            survivors |= {v[0] for v in state.values()}
        else:
            assert self.strategy == "keep-latest"
            for mid, tomb in last.values():
                if self.drop_before is not None and mid[0] < self.drop_before:
                    continue  # its time-to-live ran out
                if not tomb or (self.tombstones_from is not None and mid[0] >= self.tombstones_from):
                    survivors.add(mid)
        compacted = []
        for p, msgs in inputs:
            kept = [
                (b, k, pl, et, False) if (p, b) in survivors else (b, k, b"", et, True)
                for b, k, pl, et, out in msgs
            ]
            if any(not out for *_, out in kept):
                compacted.append((p, kept))
        self.compacted = compacted
        if after:
            self.horizon = after[-1][0]

    def view(self, first_position):
        """The compacted part of what a read-compacted consumer sees."""
        if self.retention_mode == "retention-bounded":
            return [(p, m) for p, m in self.compacted if first_position is not None and p >= first_position]
        return list(self.compacted)
