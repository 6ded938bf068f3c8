"""What every typed resource shares: JSON values, path segments from names, read-modify-write.

A resource class owns a subtree of the store (its paths are written once, in its module) and
speaks in names and Python values; nothing above it sees a path. Values are JSON objects in
UTF-8 (Pulsar keeps its policies as JSON too), so an operator can read them with any ZooKeeper
tool.

``update(path, fn)`` is Pulsar's ``BaseResources.set``: read the value and its version, apply
``fn`` to a copy, write it back with compare-and-set; when another writer won in between, read
again and re-apply ``fn`` to the new value, after a short random pause. That retry is not blind:
``fn`` sees the winner's value and decides again (it may raise to give up). Writes that must not be re-applied (a compaction
commit, a ledger list under an owner's fence) take an expected version instead and let
``BadVersion`` reach the caller.
"""

from __future__ import annotations

import copy
import json
import random
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote_plus, unquote_plus

from ...errors import AlreadyExists, MetadataError, NotFound
from ..metadata_store import NEW, BadVersion, KeyNotFound, MetadataStore, Stat

#: read-modify-write attempts before ``update`` gives up (each lost race means another writer
#: made progress, so hitting this means heavy contention on one key)
UPDATE_ATTEMPTS = 64
#: the most a writer that lost a race sleeps before reading again: a random pause up to
#: 1 ms * 2**attempt breaks the lockstep in which the same writer loses every round
MAX_BACKOFF_S = 0.1

Json = dict[str, Any]


def encode_segment(name: str) -> str:
    """A user-chosen name as one path segment: Java's ``URLEncoder`` (Pulsar's ``Codec.encode``,
    so ``/managed-ledgers/...`` paths match Pulsar's), plus dots when the name is only dots (a
    ``.`` or ``..`` segment is not a path)."""
    encoded = quote_plus(name, safe="*").replace("~", "%7E")
    return encoded.replace(".", "%2E") if set(encoded) == {"."} else encoded


def decode_segment(segment: str) -> str:
    return unquote_plus(segment)


def dumps(value: Json) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def loads(raw: bytes, path: str) -> Json:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise MetadataError(f"metadata at {path} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise MetadataError(f"metadata at {path} is not a JSON object")
    return value


class BaseResources:
    def __init__(self, store: MetadataStore):
        self.store = store

    def _read(self, path: str) -> tuple[Json, int] | None:
        got = self.store.get(path)
        return None if got is None else (loads(got.value, path), got.stat.version)

    def _create(self, path: str, value: Json, what: str) -> Stat:
        try:
            return self.store.put(path, dumps(value), NEW)
        except BadVersion:
            raise AlreadyExists(f"{what} already exists") from None

    def _update(self, path: str, fn: Callable[[Json], Json], what: str) -> Json:
        for attempt in range(UPDATE_ATTEMPTS):
            current = self._read(path)
            if current is None:
                raise NotFound(f"{what} does not exist")
            value, version = current
            new = fn(copy.deepcopy(value))
            try:
                self.store.put(path, dumps(new), version)
                return new
            except BadVersion:
                time.sleep(random.uniform(0, min(MAX_BACKOFF_S, 0.001 * 2**attempt)))
        raise BadVersion(f"{what}: still contended after {UPDATE_ATTEMPTS} attempts")

    def _delete(self, path: str, what: str, expected_version: int | None = None) -> None:
        try:
            self.store.delete(path, expected_version)
        except KeyNotFound:
            raise NotFound(f"{what} does not exist") from None

    def _children(self, path: str) -> list[str]:
        return [decode_segment(c) for c in self.store.get_children(path)]
