"""The Pulsar binary protocol, sans-I/O: bytes in, frames out; commands in, bytes out.

Modules: ``pulsar_pb2`` (generated from our ``pulsar.proto``), ``frames`` (framing, entries,
checksums), ``compression`` (payload codecs), ``batch`` (batch payloads), ``commands``
(command builders, message ids), ``connection`` (the broker-side handshake state table).
Nothing here touches sockets, asyncio or clocks.
"""
