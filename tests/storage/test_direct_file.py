"""``DirectWriter``: the bytes of a file written through direct I/O (or, when it is off or the
file system refuses it, through the page cache) are exactly the bytes appended, whatever their
sizes and alignment."""

import contextlib
import os

import numpy as np
import pytest

from compactmq.storage.direct_file import BLOCK, DirectWriter


def _pieces(seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    sizes = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3, 5 << 20, 17, 9 << 20, 2 * BLOCK, 12345]
    return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]


@pytest.mark.parametrize("direct", [True, False])
def test_written_bytes_are_the_appended_bytes(tmp_path, direct):
    path = str(tmp_path / "f")
    pieces = _pieces(1)
    w = DirectWriter(path, direct=direct, buffer_bytes=1 << 20)
    expect = bytearray()
    for k, piece in enumerate(pieces):
        if k % 2:
            w.write(piece)
        else:  # filled in place
            view = w.reserve(len(piece))
            view[:] = np.frombuffer(piece, np.uint8)
            del view
            w.commit()
        expect += piece
        assert w.tell() == len(expect)
    assert w.close() == len(expect)
    with open(path, "rb") as f:
        assert f.read() == bytes(expect)


@pytest.mark.parametrize("size", [0, 1, BLOCK, 3 * BLOCK + 7])
def test_sizes_at_and_off_block_boundaries(tmp_path, size):
    path = str(tmp_path / "f")
    data = bytes(range(256)) * (size // 256 + 1)
    w = DirectWriter(path)
    w.write(data[:size])
    w.close()
    assert os.path.getsize(path) == size
    with open(path, "rb") as f:
        assert f.read() == data[:size]


def test_direct_io_is_used_where_the_file_system_allows_it(tmp_path):
    """The writer uses ``O_DIRECT`` exactly where the file system takes it, and never when asked not to."""
    fd = None
    try:
        fd = os.open(str(tmp_path / "probe"), os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0))
        supported = hasattr(os, "O_DIRECT")
    except OSError:
        supported = False
    finally:
        if fd is not None:
            os.close(fd)
    w = DirectWriter(str(tmp_path / "f"))
    assert w.direct == supported
    w.write(b"x" * (BLOCK + 1))
    w.close()
    buffered = DirectWriter(str(tmp_path / "g"), direct=False)
    assert buffered.direct is False
    buffered.close()


def test_abort_removes_the_file(tmp_path):
    path = str(tmp_path / "f")
    w = DirectWriter(path)
    w.write(b"partial" * 1000)
    w.abort()
    assert not os.path.exists(path)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failed_background_write_reaches_the_caller():
    """Writes happen in a background thread; their errors still surface (here: no space left on
    ``/dev/full``), at the next write that needs the buffer back or at ``close``."""
    w = DirectWriter("/dev/full", buffer_bytes=1 << 20)
    with pytest.raises(OSError):
        for _ in range(8):
            w.write(b"x" * (1 << 20))
        w.close()
    with contextlib.suppress(OSError):
        w.close()  # releases the descriptor and the thread when the error came from a write


def test_a_writer_dropped_unfinished_gives_back_its_descriptor(tmp_path):
    before = len(os.listdir("/proc/self/fd"))
    for k in range(20):
        w = DirectWriter(str(tmp_path / f"f{k}"))
        w.write(b"x" * (5 << 20))  # a background write in flight
        del w
    assert len(os.listdir("/proc/self/fd")) <= before + 1
