"""Payload codecs: data compressed the way the C++ client does it, built with the libraries
directly, decodes; our own output round-trips; hostile sizes and corrupt data are refused."""

from __future__ import annotations

import zlib

import cramjam
import lz4.block
import pytest
import zstandard

from compactmq.errors import MalformedEntry
from compactmq.protocol import compression as Z

DATA = b"".join(b"key-%d=value-%d;" % (i, i * i) for i in range(500))

# What the C++ client emits per codec, produced here with each library directly.
CLIENT_STYLE = {
    Z.LZ4: lambda d: lz4.block.compress(d, store_size=False),  # LZ4_compress_default
    Z.ZLIB: lambda d: zlib.compress(d),  # deflate, zlib wrapper
    Z.ZSTD: lambda d: zstandard.ZstdCompressor(level=3).compress(d),  # ZSTD_compress
    Z.SNAPPY: lambda d: bytes(cramjam.snappy.compress_raw(d)),  # snappy::RawCompress
}


@pytest.mark.parametrize("codec", sorted(CLIENT_STYLE), ids=Z.codec_name)
@pytest.mark.parametrize("data", [b"", b"x", DATA], ids=["empty", "one", "text"])
def test_decodes_client_style_blocks(codec, data):
    assert Z.decompress(codec, CLIENT_STYLE[codec](data), len(data)) == data


@pytest.mark.parametrize("codec", Z.CODECS, ids=Z.codec_name)
@pytest.mark.parametrize("data", [b"", b"x", DATA], ids=["empty", "one", "text"])
def test_round_trip(codec, data):
    size = len(data) if codec != Z.NONE else 0
    assert Z.decompress(codec, Z.compress(codec, data), size) == data


@pytest.mark.parametrize("codec", sorted(CLIENT_STYLE), ids=Z.codec_name)
def test_our_blocks_decode_with_the_libraries(codec):
    block = Z.compress(codec, DATA)
    decoded = {
        Z.LZ4: lambda b: lz4.block.decompress(b, uncompressed_size=len(DATA)),
        Z.ZLIB: zlib.decompress,
        Z.ZSTD: lambda b: zstandard.ZstdDecompressor().decompress(b),
        Z.SNAPPY: lambda b: bytes(cramjam.snappy.decompress_raw(b)),
    }[codec](block)
    assert decoded == DATA


def test_lz4_zlib_zstd_blocks_equal_the_clients_bytes():
    # Same library defaults as the C++ client: byte-identical blocks (checked against real
    # captures in test_batch). Snappy implementations differ in their choices, not the format.
    for codec in (Z.LZ4, Z.ZLIB, Z.ZSTD):
        assert Z.compress(codec, DATA) == CLIENT_STYLE[codec](DATA)


@pytest.mark.parametrize("codec", sorted(CLIENT_STYLE), ids=Z.codec_name)
def test_announced_size_above_the_limit_is_refused_before_decoding(codec):
    with pytest.raises(MalformedEntry, match="limit"):
        Z.decompress(codec, CLIENT_STYLE[codec](DATA), 10_000, max_size=9_999)


@pytest.mark.parametrize("codec", sorted(CLIENT_STYLE), ids=Z.codec_name)
@pytest.mark.parametrize("delta", [-1, 1])
def test_wrong_announced_size(codec, delta):
    with pytest.raises(MalformedEntry):
        Z.decompress(codec, CLIENT_STYLE[codec](DATA), len(DATA) + delta)


@pytest.mark.parametrize("codec", sorted(CLIENT_STYLE), ids=Z.codec_name)
def test_corrupt_blocks(codec):
    block = bytearray(CLIENT_STYLE[codec](DATA))
    for cut in (block[: len(block) // 2], block[:1], b"", b"\xff" * 40):
        with pytest.raises(MalformedEntry):
            Z.decompress(codec, bytes(cut), len(DATA))


def test_zlib_bomb_stops_at_the_announced_size():
    bomb = zlib.compress(b"\x00" * 50_000_000)
    with pytest.raises(MalformedEntry):
        Z.decompress(Z.ZLIB, bomb, 1000)


def test_unknown_codec():
    with pytest.raises(MalformedEntry, match="unknown"):
        Z.decompress(9, b"abc", 3)
    with pytest.raises(ValueError):
        Z.compress(9, b"abc")
    assert Z.codec_name(9) == "codec 9"
    assert Z.codec_name(Z.ZSTD) == "ZSTD"


def test_none_ignores_uncompressed_size():
    # Producers leave uncompressed_size at 0 for uncompressed payloads.
    assert Z.decompress(Z.NONE, b"abc", 0) == b"abc"
