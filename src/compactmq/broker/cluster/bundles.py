"""Namespace bundles: the hash ranges a namespace's topics are split into, as Pulsar splits them.

A topic belongs to the bundle whose range holds the hash of its full name
(``persistent://tenant/ns/topic``, a partition's name for a partition): CRC-32 of the UTF-8 bytes,
as an unsigned 32-bit number (Pulsar's ``Hashing.crc32()`` and ``padToLong()``; ``zlib.crc32``
is the same CRC). So a topic falls into the same range on compactmq as on Pulsar.

A namespace of ``n`` bundles has ``n + 1`` boundaries: ``0``, then multiples of ``2**32 // n``,
and ``0xffffffff`` last (Pulsar's ``getBundles(numBundles)``). A bundle ``[lower, upper)`` is
written ``0x%08x_0x%08x``; the last bundle also holds ``0xffffffff`` (closed at both ends).
The boundaries are fixed the first time a namespace's bundles are needed and kept in its
policies (``"bundles": {"boundaries": [...], "numBundles": n}``, Pulsar's ``BundlesData``), so
every broker agrees even when their ``defaultNumberOfNamespaceBundles`` differ.
"""

from __future__ import annotations

import bisect
import zlib
from dataclasses import dataclass
from typing import Any

from ...errors import PreconditionFailed

FULL_UPPER = 0xFFFFFFFF
#: most bundles a namespace may have here (Pulsar allows up to 2**32; a ZooKeeper key per
#: bundle makes anything near that unusable)
MAX_BUNDLES = 1 << 16


def topic_hash(topic: str) -> int:
    """Pulsar's bundle hash of a full topic name."""
    return zlib.crc32(topic.encode("utf-8")) & 0xFFFFFFFF


def boundaries_for(num_bundles: int) -> list[int]:
    """The ``num_bundles + 1`` boundaries of a namespace split evenly."""
    if not 0 < num_bundles <= MAX_BUNDLES:
        raise PreconditionFailed(f"the number of bundles must be in 1..{MAX_BUNDLES}, not {num_bundles}")
    step = (1 << 32) // num_bundles
    return [i * step for i in range(num_bundles)] + [FULL_UPPER]


def format_boundary(value: int) -> str:
    return f"0x{value:08x}"


def bundles_data(boundaries: list[int]) -> dict:
    """Pulsar's ``BundlesData`` JSON (the body of ``GET .../bundles``)."""
    return {"boundaries": [format_boundary(b) for b in boundaries], "numBundles": len(boundaries) - 1}


def parse_bundles_data(value: object) -> list[int] | None:
    """Boundaries from a stored ``BundlesData``; None when absent or malformed."""
    if not isinstance(value, dict) or not isinstance(value.get("boundaries"), list):
        return None
    try:
        out = [int(str(b), 16) for b in value["boundaries"]]
    except ValueError:
        return None
    if len(out) < 2 or out[0] != 0 or out[-1] != FULL_UPPER or out != sorted(set(out)):
        return None
    return out


def stored_boundaries(namespaces: Any, namespace: str, default_bundles: int) -> list[int]:
    """Blocking: the boundaries kept in ``namespace``'s policies (``NamespaceResources``); the
    first caller stores the default split there (compare-and-set, so every broker ends up with
    the same). ``NotFound`` when the namespace does not exist."""
    policies = namespaces.get_policies(namespace)
    found = parse_bundles_data((policies or {}).get("bundles"))
    if found is not None:
        return found

    def fix(p: dict[str, Any]) -> dict[str, Any]:
        if parse_bundles_data(p.get("bundles")) is None:
            p["bundles"] = bundles_data(boundaries_for(default_bundles))
        return p

    stored = namespaces.set_policies(namespace, fix)
    return parse_bundles_data(stored.get("bundles")) or boundaries_for(default_bundles)


@dataclass(frozen=True, order=True)
class Bundle:
    namespace: str  # tenant/namespace
    lower: int
    upper: int

    @property
    def range(self) -> str:
        """``0x00000000_0x40000000``: the bundle's name in paths and admin calls."""
        return f"{format_boundary(self.lower)}_{format_boundary(self.upper)}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.range}"


def bundle_of(namespace: str, boundaries: list[int], topic: str) -> Bundle:
    """The bundle of ``namespace`` (split at ``boundaries``) that holds ``topic``."""
    h = topic_hash(topic)
    i = bisect.bisect_right(boundaries, h) - 1
    i = min(max(i, 0), len(boundaries) - 2)  # 0xffffffff itself: the last, closed bundle
    return Bundle(namespace, boundaries[i], boundaries[i + 1])


def all_bundles(namespace: str, boundaries: list[int]) -> list[Bundle]:
    return [Bundle(namespace, lo, hi) for lo, hi in zip(boundaries, boundaries[1:])]


def parse_range(namespace: str, boundaries: list[int], text: str) -> Bundle:
    """The bundle named ``0x..._0x...`` (case-insensitive); 412 unless it is one of the namespace's."""
    lo_s, sep, hi_s = text.partition("_")
    try:
        lo, hi = int(lo_s, 16), int(hi_s, 16)
    except ValueError:
        lo = hi = -1
    bundle = Bundle(namespace, lo, hi)
    if not sep or bundle not in all_bundles(namespace, boundaries):
        raise PreconditionFailed(f"{text!r} is not a bundle of {namespace} (see GET .../bundles)")
    return bundle
