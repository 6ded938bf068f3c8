"""The writer process of the object-ledger crash test: dies in the middle of a flush.

``python object_crash_writer.py ENDPOINT BUCKET PREFIX``: writes ``DURABLE`` records to ledger 1
and syncs them, prints ``synced``, then writes one more record of ``BIG`` bytes and syncs it
through an upload that sends half of the flush object's bytes (enough for the S3 client to
ship a multipart part to the server) and then ends the process with ``os._exit`` -- no
``close``, no completion of the upload, as a SIGKILL or power cut in the middle of a PUT.
"""

import os
import sys

from compactmq.storage import ledger_file as lf
from compactmq.storage import object_ledgers
from compactmq.storage.object_ledgers import ObjectLedgerSettings, ObjectLedgerStorage
from compactmq.storage.offload.blobstore import BlobStore, OffloadLocation

TOPIC = "persistent://public/default/object-crash"
DURABLE = 3
BIG = 24 * 1024 * 1024  # over pyarrow's S3 part size, so part of it reaches the server


def record(entry_id: int, data: bytes) -> bytes:
    return lf.encode_record_header(entry_id, 1000 + entry_id, data) + data


def _dies_half_way(store: BlobStore, key: str, data: bytes) -> None:
    out = store.fs.open_output_stream(store.path(key))
    out.write(data[: len(data) // 2])
    out.flush()
    sys.stdout.flush()
    os._exit(9)


def main(endpoint: str, bucket: str, prefix: str) -> None:
    loc = OffloadLocation("s3", bucket, "us-east-1", endpoint, prefix)
    st = ObjectLedgerStorage(BlobStore(loc), TOPIC, ObjectLedgerSettings(flush_interval_ms=0))
    w = st.create(1)
    end = lf.FILE_HEADER_SIZE
    for i in range(DURABLE):
        rec = record(i, b"durable-%d" % i)
        w.write(rec, end)
        end += len(rec)
    w.sync()
    print("synced", end, flush=True)
    big = record(DURABLE, b"x" * BIG)
    w.write(big, end)
    object_ledgers.put_object = _dies_half_way
    w.sync()
    print("survived", flush=True)  # never reached


if __name__ == "__main__":
    main(*sys.argv[1:4])
