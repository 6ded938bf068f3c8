"""The latest value of a key over HTTP: ``GET .../{topic}/latest/{key}`` and ``POST .../latest``.

Pulsar's only way to learn one key's current value is to build a TableView (read the whole
compacted view and the tail). These paths answer it directly from the broker
(``broker.latest_values``): the key's message a TableView would hold at this instant, or 404
(``GET``) / ``"found": false`` (``POST``) when it has none -- never written, deleted by a tombstone,
or removed by retention.

A found message is::

    {"key": "k", "found": true, "value": "<base64 of the payload>",
     "properties": {...}, "messageId": {"ledgerId": L, "entryId": E, "batchIndex": B,
     "partitionIndex": P}, "publishTime": ms, "eventTime": ms (0: none),
     "topic": "persistent://tenant/ns/topic[-partition-P]"}

``batchIndex`` is -1 for a message that is not in a batch; ``partitionIndex`` -1 for a
non-partitioned topic. An encrypted message carries ``"encrypted": true`` and its payload as
stored. The payload is base64 because it is bytes (the schema registry's paths encode bytes the
same way).

Who may ask: a role that may consume the topic (``consume`` on it or its namespace, tenant admin,
superuser): the answer is a message, what a consumer would receive.

Partitioned topics: a key is looked up in every partition, not routed by a hash. The clients
route keyed messages with different hashes (the Java and Go clients ``JavaStringHash``, the C++
client and the Python client built on it ``BoostHash``, whose value depends on the Boost version
the client was built with; measured with pulsar-client 3.13.0: neither Murmur3_32 nor the Java
hash places its keys), so no single hash finds a key whatever produced it. Each partition's
lookup is an index probe; when several partitions hold the key, the message with the latest
publish time answers (ties: the higher partition).

Keys are untrusted: a key in the path arrives percent-encoded and is decoded as one segment
(``%2F`` stays part of the key); it is only ever hashed and compared, never used as a path. A key
is at most ``MAX_KEY_BYTES`` bytes of UTF-8, a POST at most ``MAX_KEYS`` keys.
"""

from __future__ import annotations

import base64
from typing import Any, Optional

from aiohttp import web

from ..errors import InvalidInput, NotAllowed, NotFound, TopicNotFound
from ..naming import TopicName
from .access import CONSUME
from .common import Context, read_json
from .router import Router

TOPIC = "/admin/v2/{domain}/{tenant}/{namespace}/{topic}"
#: longest key accepted, in UTF-8 bytes (a URL line is limited to httpMaxRequestHeaderSize anyway)
MAX_KEY_BYTES = 4096
#: keys one POST may ask for (each is an index probe and one message read)
MAX_KEYS = 1000


def add_routes(router: Router) -> None:
    router.add(
        "GET",
        TOPIC + "/latest/{key}",
        get_latest,
        "the latest message of a key: the compacted view plus the tail, as a TableView holds it",
        requires=CONSUME,
    )
    router.add(
        "POST",
        TOPIC + "/latest",
        post_latest,
        "the latest message of each key of a JSON list",
        body="array",
        requires=CONSUME,
    )


def check_key(key: Any) -> bytes:
    """A requested key as bytes; ``InvalidInput`` when it is not a string or too long."""
    if not isinstance(key, str):
        raise InvalidInput(f"a key must be a string, not {type(key).__name__}")
    raw = key.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_KEY_BYTES:
        raise InvalidInput(f"a key is at most {MAX_KEY_BYTES} bytes ({len(raw)} given)")
    return raw


def _keys_of(body: Any) -> list[bytes]:
    keys = body.get("keys") if isinstance(body, dict) else body
    if not isinstance(keys, list):
        raise InvalidInput('expected a JSON list of keys (or {"keys": [...]})')
    if len(keys) > MAX_KEYS:
        raise InvalidInput(f"at most {MAX_KEYS} keys per request ({len(keys)} given)")
    return [check_key(k) for k in keys]


async def get_latest(ctx: Context, request: web.Request, key: str, **path: str) -> Any:
    raw = check_key(key)
    (answer,) = await lookup(ctx, _topic_of(path), [raw])
    if not answer["found"]:
        raise NotFound(f"key {key!r} has no value on {_topic_of(path)} (never written, or deleted)")
    return answer


async def post_latest(ctx: Context, request: web.Request, **path: str) -> Any:
    keys = _keys_of(await read_json(request, "a JSON list of keys"))
    return await lookup(ctx, _topic_of(path), keys)


def _topic_of(path: dict) -> str:
    tn = TopicName.parse(f"{path['domain']}://{path['tenant']}/{path['namespace']}/{path['topic']}")
    if not tn.persistent:
        raise NotAllowed(f"{tn}: a non-persistent topic keeps no values to look up")
    return str(tn)


async def lookup(ctx: Context, topic: str, keys: list[bytes]) -> list[dict[str, Any]]:
    """One answer per key, in order (``found`` false for a key without a value)."""
    loaded = ctx.service.topics.loaded.get(topic)
    if loaded is not None and not loaded.closed:
        partitions = None  # a loaded topic exists and is not a partitioned topic's name
    else:
        partitions = await ctx.run_blocking(_partitions_blocking, ctx, topic)
    if partitions is None:
        names = [topic]
    else:
        tn = TopicName.parse(topic)
        names = [str(tn.partition(i)) for i in range(partitions)]
    best: list[Optional[tuple]] = [None] * len(keys)
    latest = ctx.service.latest_values
    for index, name in enumerate(names):
        loaded = ctx.service.topics.loaded.get(name)
        if loaded is None or loaded.closed:
            loaded = await ctx.service.topics.get_topic(name, create=False)
        found = await ctx.run_blocking(latest.lookup_blocking, loaded, keys)
        part = index if partitions is not None else -1
        for i, msg in enumerate(found):
            held = best[i]
            if msg is not None and (held is None or msg.publish_time >= held[0].publish_time):
                best[i] = (msg, part, name)
    return [_render(k, b) for k, b in zip(keys, best)]


def _partitions_blocking(ctx: Context, topic: str) -> Optional[int]:
    """Partitions of ``topic``, None for a non-partitioned one (one trip to the thread pool:
    every hop costs a lookup latency); ``TopicNotFound`` when it is neither."""
    partitions = ctx.storage.partitions(topic)
    if partitions is None and not ctx.topic_metadata.topic_exists(topic):
        raise TopicNotFound(f"topic {topic} does not exist")
    return partitions


def _render(key: bytes, best: Optional[tuple]) -> dict[str, Any]:
    text = key.decode("utf-8", "surrogatepass")
    if best is None:
        return {"key": text, "found": False}
    msg, partition, name = best
    out: dict[str, Any] = {
        "key": text,
        "found": True,
        "value": base64.b64encode(msg.value).decode("ascii"),
        "properties": msg.properties,
        "messageId": {
            "ledgerId": msg.ledger_id,
            "entryId": msg.entry_id,
            "batchIndex": msg.batch_index,
            "partitionIndex": partition,
        },
        "publishTime": msg.publish_time,
        "eventTime": msg.event_time,
        "topic": name,
    }
    if msg.encrypted:
        out["encrypted"] = True
    return out
