"""Keys that are not compactmq's: Pulsar keys accepted without effect, and near misses of ours.

A Pulsar ``broker.conf``/``standalone.conf`` is accepted as is: keys of parts compactmq does not
have (BookKeeper, ZooKeeper, the load balancer, functions, ...) are known by name
(``pulsar_conf_keys.txt``, or a prefix in ``IGNORED_PREFIXES``) and reported once at start. A key
nobody knows is reported too, with a "did you mean" when it is a near miss of a declared key.
"""

from __future__ import annotations

import difflib
import functools
from importlib import resources

from .keys import SETTINGS

# Key prefixes of Pulsar parts compactmq does not have; such keys are ignored even when newer
# Pulsar releases add names that pulsar_conf_keys.txt does not list yet.
IGNORED_PREFIXES = (
    "bookkeeper",
    "bookie",
    "dbStorage_",
    "journal",
    "zooKeeper",
    "zookeeper",
    "metadataStore",
    "configurationMetadataStore",
    "loadBalancer",
    "functionsWorker",
    "transaction",
    "webSocket",
    "replicat",
    "managedLedgerOffload",
    "s3ManagedLedgerOffload",
    "gcsManagedLedgerOffload",
    "packages",
    "brokerClient",
)


@functools.cache
def pulsar_conf_keys() -> frozenset[str]:
    """Key names of Pulsar's broker.conf/standalone.conf (read once, when first needed)."""
    text = resources.files("compactmq").joinpath("pulsar_conf_keys.txt").read_text()
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def is_ignored_pulsar_key(key: str) -> bool:
    """A Pulsar key of a part compactmq does not have: accepted, reported, without effect."""
    return key not in SETTINGS and (key in pulsar_conf_keys() or key.startswith(IGNORED_PREFIXES))


def suggest_key(key: str) -> str | None:
    """The implemented key ``key`` is a near miss of (a typo, another case), or None."""
    by_lower = {k.lower(): k for k in SETTINGS}
    if key.lower() in by_lower:
        return by_lower[key.lower()]
    close = difflib.get_close_matches(key, SETTINGS, n=1, cutoff=0.85)
    return close[0] if close else None


def describe_unknown_keys(keys: tuple[str, ...] | list[str]) -> str:
    """``a (did you mean b?), c``: the unknown keys, each with its suggestion when it has one."""
    parts = []
    for key in keys:
        hint = suggest_key(key)
        parts.append(f"{key} (did you mean {hint}?)" if hint else key)
    return ", ".join(parts)
