"""A broker that stores nothing: the ceiling of what any broker could give the official client.

It speaks just enough of the protocol for a producer (CONNECT, the topic lookup, PRODUCER, PING,
CLOSE_PRODUCER) and answers every SEND with its SEND_RECEIPT as soon as the read that carried it
is handled (or, with ``--hold-ms``, reads held apart that long, as the broker holds a busy
connection's: more SENDs a read, more receipts a write): no ledger, no fsync, no dispatch,
positions counted in memory. Whatever throughput
the official client reaches against it on this machine, no real broker can beat, so it tells
how far a publish ratio against another broker *can* move (``publish_probe.py --null``).

Built from the project's own protocol package (``wire.split_sends``, ``send_receipt_frames``:
the same C paths as the broker's fast path), on uvloop like the broker. Not a test double: it is
never used by the tests, only measured.

    .venv/bin/python bench/null_broker.py --port 6651   # prints "ready" once it listens
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from compactmq.protocol import commands, frames, wire
from compactmq.protocol import pulsar_pb2 as pb

T = pb.BaseCommand


class NullConnection(asyncio.Protocol):
    def __init__(self, url: str, hold_s: float) -> None:
        self.url = url
        self.hold_s = hold_s
        self.held = False
        self.decoder = frames.FrameDecoder(frames.max_frame_size_for(5 * 1024 * 1024), send_runs=True)
        self.transport: asyncio.Transport | None = None
        self.entry_id = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        out: list[bytes] = []
        sends = False
        for frame in self.decoder.feed(data):
            if frame.type == T.SEND:
                self._receipts(frame, out)
                sends = True
            else:
                reply = self._answer(frame.command)
                if reply is not None:
                    out.append(frames.encode_command(reply))
        if out:
            self.transport.writelines(out)
        if sends and self.hold_s and not self.held:  # --hold-ms: the next read takes more
            self.held = True
            self.transport.pause_reading()
            asyncio.get_running_loop().call_later(self.hold_s, self._end_hold)

    def _end_hold(self) -> None:
        self.held = False
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def _receipts(self, frame, out: list[bytes]) -> None:
        if isinstance(frame, frames.SendRun):
            producer_id, receipts, count = frame.producer_id, frame.receipts, len(frame)
        else:
            send = frame.body
            producer_id, count = send.producer_id, 1
            receipts = wire.pack_receipt(send.sequence_id, send.highest_sequence_id or None)
        out.append(wire.send_receipt_frames(producer_id, -1, 0, self.entry_id, receipts))
        self.entry_id += count

    def _answer(self, cmd):
        t = cmd.type
        if t == T.CONNECT:
            version = commands.negotiated_version(cmd.connect.protocol_version)
            return commands.connected(version, max_message_size=5 * 1024 * 1024)
        if t == T.PARTITIONED_METADATA:
            return commands.partitioned_metadata_response(cmd.partitionMetadata.request_id, 0)
        if t == T.LOOKUP:
            return commands.lookup_response(cmd.lookupTopic.request_id, self.url, authoritative=True)
        if t == T.PRODUCER:
            p = cmd.producer
            return commands.producer_success(p.request_id, p.producer_name or f"null-{p.producer_id}")
        if t == T.CLOSE_PRODUCER:
            return commands.success(cmd.close_producer.request_id)
        if t == T.PING:
            return commands.pong()
        return None  # PONG and anything else: no answer


async def serve(port: int, hold_s: float) -> None:
    loop = asyncio.get_running_loop()
    url = f"pulsar://127.0.0.1:{port}"
    server = await loop.create_server(lambda: NullConnection(url, hold_s), "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument(
        "--hold-ms", type=float, default=0.0, help="pause reading this long after a read of SENDs (0: never)"
    )
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - the broker's own loop is uvloop when installed
        pass
    try:
        asyncio.run(serve(args.port, args.hold_ms / 1000))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
