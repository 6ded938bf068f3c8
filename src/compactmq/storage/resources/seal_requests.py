"""Seal requests: a ``compact-topic`` job asks the data directory's writer to seal a topic's ledger.

::

    /compactmq/seal-requests/request-NNNNNNNNNN    {"topic", "requested_ms"}
                                                   then {..., "answered_ms", "error", "code"}

The job files a request as an **ephemeral sequential** key (ZooKeeper's queue recipe: the counter
orders requests, and the key belongs to the job's store session), watches it, and deletes it once
answered. The writer watches the parent, seals the topic of every request without an answer and
writes the answer into the request with compare-and-set on the version it read, so a request the
job withdrew meanwhile is never brought back (the write fails with ``BadVersion``). A job that dies
leaves nothing behind: its session ends (at once on a clean close, after
``metadataStoreSessionTimeoutMillis`` otherwise) and its ephemeral request goes with it.

The requests live in the local metadata store, the one the writer of the data directory uses; one
writer answers them all (brokers do not share a store yet; with ownership, the next step, a
request goes to the topic's owner).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import MetadataError
from ..metadata_store import BadVersion, KeyNotFound, Watch, WatchCallback
from .base import BaseResources, Json, dumps

SEAL_REQUESTS_ROOT = "/compactmq/seal-requests"
_PREFIX = "request-"


@dataclass(frozen=True)
class SealRequest:
    """One request as read: ``version`` is what ``answer`` compares against."""

    request_id: str
    topic: str
    version: int
    answered: bool
    error: str | None = None
    #: the name of the error's class (``TopicNotFound``...), so the job can raise the same kind
    code: str | None = None


def _path(request_id: str) -> str:
    if not request_id.startswith(_PREFIX) or not request_id[len(_PREFIX) :].isdigit():
        raise MetadataError(f"{request_id!r} is not a seal request id")
    return f"{SEAL_REQUESTS_ROOT}/{request_id}"


class SealRequestResources(BaseResources):
    # --- the job's side ---------------------------------------------------------------------

    def file(self, topic: str, now_ms: int) -> str:
        """File a request to seal ``topic``; returns its id (ephemeral: it dies with this session)."""
        value = dumps({"topic": topic, "requested_ms": now_ms})
        stat = self.store.put(f"{SEAL_REQUESTS_ROOT}/{_PREFIX}", value, ephemeral=True, sequential=True)
        return stat.path.rsplit("/", 1)[1]

    def get(self, request_id: str) -> SealRequest | None:
        """The request now (None: it is gone: withdrawn, or its session expired)."""
        got = self._read(_path(request_id))
        return None if got is None else _request(request_id, *got)

    def watch(self, request_id: str, callback: WatchCallback) -> Watch:
        """``callback`` when the request changes (answered) or goes."""
        return self.store.watch(_path(request_id), callback)

    def withdraw(self, request_id: str) -> None:
        try:
            self.store.delete(_path(request_id))
        except KeyNotFound:
            pass

    # --- the writer's side ------------------------------------------------------------------

    def pending(self) -> list[SealRequest]:
        """Requests not answered yet, oldest first."""
        out = []
        for child in self.store.get_children(SEAL_REQUESTS_ROOT):
            if not child.startswith(_PREFIX):
                continue
            got = self._read(f"{SEAL_REQUESTS_ROOT}/{child}")
            if got is not None:
                request = _request(child, *got)
                if not request.answered:
                    out.append(request)
        return out

    def watch_pending(self, callback: WatchCallback) -> Watch:
        """``callback`` when a request is filed or withdrawn."""
        return self.store.watch(SEAL_REQUESTS_ROOT, callback)

    def answer(
        self, request: SealRequest, now_ms: int, error: str | None = None, code: str | None = None
    ) -> bool:
        """Stamp ``request`` answered; False when it changed or went meanwhile (the job gave up)."""
        path = _path(request.request_id)
        got = self._read(path)
        if got is None or got[1] != request.version:
            return False
        value = {**got[0], "answered_ms": now_ms, "error": error, "code": code}
        try:
            self.store.put(path, dumps(value), request.version)
        except BadVersion:
            return False
        return True


def _request(request_id: str, value: Json, version: int) -> SealRequest:
    return SealRequest(
        request_id,
        str(value.get("topic") or ""),
        version,
        "answered_ms" in value,
        value.get("error"),
        value.get("code"),
    )
