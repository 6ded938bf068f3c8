"""How the objects of one ledger in an object store make up its bytes (``object_ledgers``).

A ledger written by ``ObjectLedgerStorage`` is a set of objects under one key prefix, named
(integers only, fixed widths, so names sort by offset)::

    f-<start:016d>-<end:016d>-e<epoch:010d>   a flush object: ledger bytes [start, end)
    m-<size:016d>-e<epoch:010d>               the merged ledger: bytes [0, size)
    index                                     the ledger's index (replaced whole)

``resolve_layout`` turns a listing (name -> size) into the ledger: a merged object, when there
is one whose size matches its name, IS the ledger (the highest epoch; of its, the shortest,
since a ``cut`` only shortens); else flush objects are chained from offset 0, the highest
epoch's object at each offset, and the first gap ends the ledger. An object whose size
disagrees with the range its name gives (an upload cut short and completed anyway) is never
used. Whatever the layout does not use is returned too, for ``discard_partial_writes``.

With a group flush (``object_group_flush``), a ledger's bytes may also be *ranges* of shared
objects, committed as records in the metadata store: ``resolve_layout`` takes them as
``(start, end, epoch, name)`` beside the listing and chains them like flush objects (their
part name, ``g:<epoch>:<offset>:<member>:<key>``, says where they are: ``shared_part``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_FLUSH = re.compile(r"^f-(\d{16})-(\d{16})-e(\d{10})$")
_MERGED = re.compile(r"^m-(\d{16})-e(\d{10})$")
INDEX_NAME = "index"


@dataclass
class Layout:
    """Which objects hold a ledger's bytes: ``(start, end, key)`` in offset order."""

    parts: list[tuple[int, int, str]] = field(default_factory=list)
    merged: bool = False

    @property
    def end(self) -> int:
        return self.parts[-1][1] if self.parts else 0


def shared_part(name: str) -> tuple[str, int] | None:
    """For a part in a shared object (``g:<epoch>:<offset>:<member>:<key>``): its key (under the
    store's prefix, not the ledger's) and offset; None for a ledger's own object."""
    if not name.startswith("g:"):
        return None
    _, _epoch, offset, _member, key = name.split(":", 4)
    return key, int(offset)


def merged_epoch(name: str) -> int | None:
    """The epoch of a merged object's name (``m-<size>-e<epoch>``); None for any other name."""
    m = _MERGED.match(name)
    return int(m.group(2)) if m else None


def covered_unused(layout: Layout, unused: list[str]) -> list[str]:
    """Of ``unused`` (``resolve_layout``'s), the ledger's own objects another object provably
    holds: any object beside a merged layout (the merged one of the highest epoch is the ledger),
    flush objects whose bytes end inside the chain, and objects whose size disagrees with their
    name (used by no layout ever). A flush object past the chain's end is kept: the chain may
    end early only in this reader's view (a range record it did not see), and it costs little."""
    out = []
    for name in unused:
        if name.startswith("g:") or name == INDEX_NAME:
            continue
        f = _FLUSH.match(name)
        if layout.merged or f is None or int(f.group(2)) <= layout.end:
            out.append(name)
    return out


def resolve_layout(
    objects: dict[str, int], shared: Iterable[tuple[int, int, int, str]] = ()
) -> tuple[Layout, list[str]]:
    """The layout named by a ledger's objects (name -> size) and its ranges in shared objects
    (``(start, end, epoch, name)``), and the names it does not use (superseded or damaged
    objects, which ``discard_partial_writes`` removes; ranges a merged object superseded)."""
    merged, flushes = [], []
    for start, end, epoch, name in shared:
        if end > start:
            flushes.append((start, -epoch, -end, name))
    for name, size in objects.items():
        m = _MERGED.match(name)
        if m and int(m.group(1)) == size:
            merged.append((-int(m.group(2)), size, name))
            continue
        f = _FLUSH.match(name)
        if f and int(f.group(2)) - int(f.group(1)) == size and size > 0:
            flushes.append((int(f.group(1)), -int(f.group(3)), -int(f.group(2)), name))
    if merged:
        _, size, name = min(merged)  # the highest epoch; of its, the shortest (cut shortens)
        unused = [n for n in objects if n not in (name, INDEX_NAME)]
        return Layout([(0, size, name)], True), unused + [f[3] for f in flushes if f[3].startswith("g:")]
    parts: list[tuple[int, int, str]] = []
    pos = 0
    for start, _neg_epoch, neg_end, name in sorted(flushes):
        if start == pos:  # at each offset the highest epoch's, then the longest (a fold's)
            parts.append((start, -neg_end, name))  # object; a gap ends the ledger
            pos = -neg_end
    used = {p[2] for p in parts} | {INDEX_NAME}
    return Layout(parts), [n for n in objects if n not in used] + [
        f[3] for f in flushes if f[3].startswith("g:") and f[3] not in used
    ]


#: every object delete of the object ledgers (a ledger's objects, shared group objects), with the
#: ledger, the reason and the deleting storage's ownership epoch -- so that a delete that removed
#: bytes a committed ledger list still named can be found in the brokers' logs (issue 26). At
#: DEBUG (hundreds a minute under load): ``--log-level DEBUG``, or this logger's level set to
#: DEBUG, shows them
delete_log = logging.getLogger("compactmq.storage.object_deletes")


def delete_object(
    store, key: str, reason: str, topic: str = "", ledger_id: int = -1, epoch: int = -1
) -> None:
    """``store.delete(key)``, logged (``delete_log``) with why and under which epoch."""
    delete_log.debug(
        "object delete: key=%s topic=%s ledger=%d epoch=%d reason=%s", key, topic, ledger_id, epoch, reason
    )
    store.delete(key)
