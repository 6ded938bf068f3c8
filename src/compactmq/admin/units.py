"""Sizes and durations as pulsar-admin accepts them: ``100M``, ``10G``, ``3h``, ``2d``, ``-1``.

In the admin package (stdlib only) so that the policy declarations (``policies``), which say how
the CLI parses and shows each policy, can use them; the CLI imports them from here.
"""

from __future__ import annotations

import re

from ..errors import InvalidInput

_SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_DURATION_SECONDS = {"": 1, "S": 1, "M": 60, "H": 3600, "D": 86400, "W": 7 * 86400, "Y": 365 * 86400}
_NUMBER_UNIT = re.compile(r"^(-?\d+)([A-Za-z]?)$")


def parse_size(text: str) -> int:
    """Bytes in ``text`` (binary units, as pulsar-admin): ``100M`` -> 104857600; ``-1`` stays -1."""
    m = _NUMBER_UNIT.match(str(text).strip())
    unit = m.group(2).upper() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise InvalidInput(
            f"invalid size {text!r}: use a number with an optional unit K, M, G or T (e.g. 100M)"
        )
    value = int(m.group(1))
    if value < -1:
        raise InvalidInput(f"invalid size {text!r}: must be -1 (no limit) or at least 0, e.g. 100M")
    return value if value == -1 else value * _SIZE_UNITS[unit]


def parse_duration_seconds(text: str) -> int:
    """Seconds in ``text``: ``90`` or ``90s``, ``30m``, ``3h``, ``2d``, ``1w``, ``1y``; ``-1`` stays -1."""
    m = _NUMBER_UNIT.match(str(text).strip())
    unit = m.group(2).upper() if m else None
    if not m or unit not in _DURATION_SECONDS:
        raise InvalidInput(
            f"invalid duration {text!r}: use a number with an optional unit s, m, h, d, w or y (e.g. 3h)"
        )
    value = int(m.group(1))
    if value < -1:
        raise InvalidInput(f"invalid duration {text!r}: must be -1 (forever) or at least 0, e.g. 3h")
    return value if value == -1 else value * _DURATION_SECONDS[unit]


def format_bytes(n: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
