"""Payload codecs, byte-compatible with what the Pulsar C++ client (pulsar-client) produces.

A producer compresses the whole payload of an entry (for a batch: the concatenated
``[size][SingleMessageMetadata][payload]`` records) as one block, sets
``MessageMetadata.compression`` to the codec and ``uncompressed_size`` to the length before
compression. The block formats, as the C++ client writes them:

=======  ============================================================================
NONE     the bytes as they are
LZ4      one raw LZ4 block, no frame header and no size prefix (the size travels in
         ``uncompressed_size``)
ZLIB     a zlib stream (2-byte header, deflate data, Adler-32 trailer)
ZSTD     one zstd frame (with the content size in its header)
SNAPPY   raw snappy (a varint length, then snappy elements), not the framing format
=======  ============================================================================

``uncompressed_size`` comes from the peer, so :func:`decompress` refuses sizes above a limit
before allocating anything (a decompression bomb must not exhaust the broker's memory), and
checks that the output has exactly the announced size.
"""

from __future__ import annotations

import zlib

import cramjam
import lz4.block
import zstandard

from compactmq.errors import MalformedEntry
from compactmq.protocol import pulsar_pb2 as pb

NONE = pb.NONE
LZ4 = pb.LZ4
ZLIB = pb.ZLIB
ZSTD = pb.ZSTD
SNAPPY = pb.SNAPPY

CODECS = (NONE, LZ4, ZLIB, ZSTD, SNAPPY)

# Largest uncompressed payload we agree to produce. A payload is bounded by the broker's
# maxMessageSize (default 5 MiB) before compression; 64 MiB leaves room for operators who raise
# maxMessageSize while still refusing absurd sizes announced by a hostile or corrupt entry.
DEFAULT_MAX_UNCOMPRESSED_SIZE = 64 * 1024 * 1024

# zstd level used when we compress (the C++ client's default level is 3 as well; any level
# decodes the same way).
_ZSTD_LEVEL = 3

_zstd_compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_content_size=True)
_zstd_decompressor = zstandard.ZstdDecompressor()


def codec_name(codec: int) -> str:
    """``"LZ4"`` for ``LZ4`` ...; ``"codec 9"`` for a value we do not know."""
    try:
        return pb.CompressionType.Name(codec)
    except ValueError:
        return f"codec {codec}"


def compress(codec: int, data: bytes) -> bytes:
    """Compress ``data`` as one block in the format the Pulsar C++ client uses for ``codec``."""
    data = bytes(data)
    if codec == NONE:
        return data
    if codec == LZ4:
        return lz4.block.compress(data, store_size=False)
    if codec == ZLIB:
        return zlib.compress(data)
    if codec == ZSTD:
        # A fresh compressor per call would cost more than the compression of small batches.
        return _zstd_compressor.compress(data)
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    raise ValueError(f"unknown compression codec {codec}")


def decompress(
    codec: int,
    data: bytes,
    uncompressed_size: int,
    *,
    max_size: int = DEFAULT_MAX_UNCOMPRESSED_SIZE,
) -> bytes:
    """Undo :func:`compress`; the result must be exactly ``uncompressed_size`` bytes long.

    Raises:
        MalformedEntry: unknown codec, a size out of range, corrupt compressed data, or an
            output whose length differs from ``uncompressed_size`` (all the producer's fault).
    """
    if codec == NONE:
        # Pulsar producers leave uncompressed_size at 0 for uncompressed payloads.
        return bytes(data)
    if codec not in CODECS:
        raise MalformedEntry(f"unknown compression codec {codec}")
    if uncompressed_size < 0 or uncompressed_size > max_size:
        raise MalformedEntry(
            f"{codec_name(codec)} payload announces {uncompressed_size} uncompressed bytes (limit {max_size})"
        )
    try:
        out = _decompress(codec, bytes(data), uncompressed_size)
    except MalformedEntry:
        raise
    except Exception as exc:  # each library has its own error types; all mean "corrupt input"
        raise MalformedEntry(f"corrupt {codec_name(codec)} payload: {exc}") from exc
    if len(out) != uncompressed_size:
        raise MalformedEntry(
            f"{codec_name(codec)} payload decompressed to {len(out)} bytes, "
            f"metadata announced {uncompressed_size}"
        )
    return out


def _decompress(codec: int, data: bytes, size: int) -> bytes:
    if codec == LZ4:
        if size == 0:
            # LZ4 encodes nothing as one zero token byte; the library refuses a zero size.
            if data in (b"", b"\x00"):
                return b""
            _too_long(codec)
        return lz4.block.decompress(data, uncompressed_size=size)
    if codec == ZLIB:
        d = zlib.decompressobj()
        # max_length bounds the output even when the stream lies about its size.
        out = d.decompress(data, size + 1)
        if len(out) > size:
            _too_long(codec)
        out += d.flush()
        if not d.eof:
            raise MalformedEntry("truncated ZLIB payload")
        return out
    if codec == ZSTD:
        if not data:
            raise MalformedEntry("empty ZSTD payload")
        # max_output_size applies when the frame header carries no content size; a header
        # that does carry one is checked against ``size`` afterwards, and bounded first:
        content_size = zstandard.frame_content_size(data)
        if content_size > size:
            _too_long(codec)
        return _zstd_decompressor.decompress(data, max_output_size=size + 1)
    # SNAPPY: raw snappy starts with the uncompressed length as a varint; check it before
    # letting the library allocate.
    announced = _snappy_length(data)
    if announced != size:
        raise MalformedEntry(f"SNAPPY payload announces {announced} bytes, metadata {size}")
    return bytes(cramjam.snappy.decompress_raw(data))


def _too_long(codec: int) -> None:
    raise MalformedEntry(f"{codec_name(codec)} payload decompresses to more than announced")


def _snappy_length(data: bytes) -> int:
    value = 0
    for i, byte in enumerate(data[:5]):
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value
    raise MalformedEntry("corrupt SNAPPY payload: bad length prefix")
