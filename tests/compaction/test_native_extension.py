"""The compiled scan extension: how it is found, refused, and how it treats bad arguments.

Its results are compared with the numpy reference in test_entry_scan.py (the ``path`` fixture);
here: absence and staleness fall back to numpy with one warning, and out-of-range arguments raise
instead of reading or writing outside a buffer. No Spark.
"""

from __future__ import annotations

import logging
import sys
import types

import numpy as np
import pytest

from compactmq.compaction import entry_scan as es
from compactmq.compaction import message_rows as mr
from compactmq.compaction import native
from compactmq.errors import CompactionError

from . import entries as E


@pytest.fixture
def first_call(monkeypatch):
    """native.library() as on a process's first call."""
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setattr(native, "_ext", None)
    monkeypatch.delenv("COMPACTMQ_NATIVE", raising=False)


def _warnings(caplog):
    return [r for r in caplog.records if r.name == native.__name__ and r.levelno == logging.WARNING]


def _one_batch():
    blob = E.batch([("a", b"1", 0), ("b", b"22", 0), ("a", b"", 0)])
    buf = np.frombuffer(blob, np.uint8)
    return buf, np.array([0], np.int64), np.array([len(blob)], np.int64)


def test_missing_extension_means_numpy_with_one_warning(first_call, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "compactmq.compaction._scan", None)  # import raises ImportError
    caplog.set_level(logging.WARNING, native.__name__)
    assert native.library() is None
    assert native.library() is None  # decided once
    assert len(_warnings(caplog)) == 1 and "not installed" in _warnings(caplog)[0].getMessage()
    assert native.describe().startswith("numpy")
    buf, offs, lens = _one_batch()
    rows = mr.entry_rows(buf, np.arange(1), offs, lens, 0)
    assert len(rows) == 3 and int(rows.flags[2] & es.FLAG_TOMBSTONE)


def test_stale_extension_is_refused(first_call, monkeypatch, caplog):
    stale = types.ModuleType("compactmq.compaction._scan")
    stale.ABI = native.ABI - 1
    stale.__file__ = "/somewhere/_scan.so"
    monkeypatch.setitem(sys.modules, "compactmq.compaction._scan", stale)
    caplog.set_level(logging.WARNING, native.__name__)
    assert native.library() is None
    assert "stale" in _warnings(caplog)[0].getMessage()


def test_native_off_by_environment(first_call, monkeypatch):
    monkeypatch.setenv("COMPACTMQ_NATIVE", "0")
    assert native.library() is None and native.describe() == "numpy (COMPACTMQ_NATIVE=0)"


@pytest.fixture
def ext(first_call):
    lib = native.library()
    if lib is None:
        pytest.skip("the extension is not built here (python setup.py build_ext --inplace)")
    return lib


def test_extension_is_the_loaded_path(ext):
    assert ext.ABI == native.ABI and native.describe().startswith("extension _scan")


def test_extension_rejects_ranges_outside_its_buffers(ext):
    src = np.arange(10, dtype=np.uint8)
    dst = np.zeros(10, np.uint8)
    for d, s, n in ([5], [0], [6]), ([0], [5], [6]), ([-1], [0], [1]), ([0], [-1], [1]):
        with pytest.raises(CompactionError, match="out of bounds"):
            native.copy_ranges(ext, dst, d, src, s, n)
    assert not dst.any()  # checked before anything is copied
    with pytest.raises(ValueError, match="outside the buffer"):
        native.hash_keys(ext, src, [8], [3], np.zeros(4, np.uint64))
    with pytest.raises(TypeError, match="writable"):
        ext.copy_ranges(bytes(10), np.zeros(1, np.int64), src, np.zeros(1, np.int64), np.ones(1, np.int64))


def test_extension_checks_array_sizes(ext):
    buf, offs, lens = _one_batch()
    with pytest.raises(ValueError, match="out: 1 elements"):
        ext.scan_md(buf, offs, lens, np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="64-bit integers"):
        ext.scan_md(buf, offs, lens, np.zeros(13, np.uint8))
    with pytest.raises(ValueError, match="power of two"):
        ext.last_per_key(np.zeros(4, np.int64), np.zeros(4, np.int64), np.zeros(4, np.uint8), np.full(6, -1))
    # a truncated entry is an error code, turned into CompactionError, never a read past the end
    with pytest.raises(CompactionError, match="malformed entry"):
        native.scan_md(ext, buf, offs, lens + 100)


def test_upsert_latest_checks_its_table_and_positions(ext):
    z = np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="power-of-two"):
        ext.upsert_latest(z, z, z, np.zeros(1, np.int8), np.full((3, 4), -1, np.int64), 0)
    with pytest.raises(ValueError, match="negative position"):
        ext.upsert_latest(
            z, z, np.full(1, -5, np.int64), np.zeros(1, np.int8), np.full((4, 4), -1, np.int64), 0
        )
    # a full table is an error, never an endless probe
    table = np.full((2, 4), -1, np.int64)
    with pytest.raises(ValueError, match="full"):
        ext.upsert_latest(np.arange(2), np.zeros(2, np.int64), np.arange(2), np.zeros(2, np.int8), table, 0)
    with pytest.raises(ValueError, match="flags: 1 elements"):
        ext.upsert_latest(np.arange(2), np.zeros(2, np.int64), np.arange(2), np.zeros(1, np.int8), table, 0)
