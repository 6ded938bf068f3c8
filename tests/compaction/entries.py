"""Build stored entries for tests with pulsar_pb2 (independent of the compaction scanner)."""

from __future__ import annotations

import struct

from compactmq.protocol import pulsar_pb2 as pb
from compactmq.protocol.compression import compress
from compactmq.protocol.entry_format import build_entry


def single(
    key, payload: bytes, *, event_time=0, publish_time=1000, props=None, seq=0, marker=False, encrypted=False
) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=publish_time)
    if key is not None:
        md.partition_key = key
    if event_time:
        md.event_time = event_time
    for k, v in (props or {}).items():
        md.properties.add(key=k, value=v)
    if marker:
        md.marker_type = 1
    if encrypted:
        ek = md.encryption_keys.add()
        ek.key = "k1"
        ek.value = b"secret"
    return build_entry(md, payload)


def batch(messages, *, codec=pb.NONE, publish_time=1000, seq=0) -> bytes:
    """``messages``: list of (key|None, payload, event_time) or (key, payload, event_time, compacted_out)."""
    body = bytearray()
    for m in messages:
        key, payload, et = m[:3]
        smm = pb.SingleMessageMetadata(payload_size=len(payload))
        if key is not None:
            smm.partition_key = key
        if et:
            smm.event_time = et
        if len(m) > 3 and m[3]:
            smm.compacted_out = True
        raw = smm.SerializeToString()
        body += struct.pack(">I", len(raw)) + raw + payload
    md = pb.MessageMetadata(
        producer_name="p", sequence_id=seq, publish_time=publish_time, num_messages_in_batch=len(messages)
    )
    if codec != pb.NONE:
        md.compression = codec
        md.uncompressed_size = len(body)
    return build_entry(md, compress(codec, bytes(body)) if codec != pb.NONE else bytes(body))


def decode(entry: bytes):
    """Reference decoding with pulsar_pb2: list of (batch_index, key|None, payload, event_time,
    compacted_out) and the outer metadata."""
    from compactmq.protocol.compression import decompress

    (mdsize,) = struct.unpack_from(">I", entry, 6)
    md = pb.MessageMetadata()
    md.ParseFromString(entry[10 : 10 + mdsize])
    payload = entry[10 + mdsize :]
    if not md.HasField("num_messages_in_batch") or len(md.encryption_keys):
        return md, [
            (0, md.partition_key if md.HasField("partition_key") else None, payload, md.event_time, False)
        ]
    if md.compression:
        payload = decompress(md.compression, payload, md.uncompressed_size)
    out, off = [], 0
    for i in range(md.num_messages_in_batch):
        (n,) = struct.unpack_from(">I", payload, off)
        smm = pb.SingleMessageMetadata()
        smm.ParseFromString(payload[off + 4 : off + 4 + n])
        data = payload[off + 4 + n : off + 4 + n + smm.payload_size]
        off += 4 + n + smm.payload_size
        out.append(
            (
                i,
                smm.partition_key if smm.HasField("partition_key") else None,
                data,
                smm.event_time,
                smm.compacted_out,
            )
        )
    return md, out
