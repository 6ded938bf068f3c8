"""The C accelerator loads code only from a directory this user alone controls (no Spark)."""

from __future__ import annotations

import logging
import os
import shutil

import pytest

from compactmq.compaction import native

HAVE_CC = shutil.which("cc") is not None


@pytest.fixture
def fresh(monkeypatch):
    """native.library() as on a process's first call, with the cache dir under the test's control."""
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.delenv("COMPACTMQ_NATIVE", raising=False)
    monkeypatch.delenv("COMPACTMQ_NATIVE_USE_CC", raising=False)

    def use(d):
        monkeypatch.setenv("COMPACTMQ_NATIVE_CACHE", str(d))

    return use


def refused(caplog, words: str) -> None:
    assert native.library() is None
    assert native.library() is None  # decided once
    warnings = [r for r in caplog.records if r.name == native.__name__ and r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # logged once, not per call
    assert words in warnings[0].getMessage()


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o1777])
def test_a_directory_others_can_write_to_is_refused(fresh, tmp_path, caplog, mode):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(mode)
    fresh(d)
    refused(caplog, "must be 700")
    assert list(d.iterdir()) == []  # nothing built or loaded there


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler here")
def test_a_directory_only_readable_by_others_is_tightened(fresh, tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    d.chmod(0o755)
    fresh(d)
    assert native.library() is not None
    assert os.lstat(d).st_mode & 0o777 == 0o700


def test_a_symlinked_directory_is_never_followed(fresh, tmp_path, caplog):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    fresh(link)
    refused(caplog, "symlink")
    assert list(real.iterdir()) == []


def test_a_planted_library_writable_by_others_is_not_loaded(fresh, tmp_path, caplog):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    digest = __import__("hashlib").sha256(native.SOURCE.encode()).hexdigest()[:16]
    so = d / f"cmq_scan_{digest}.so"
    so.write_bytes(b"not a library")
    so.chmod(0o666)
    fresh(d)
    refused(caplog, "writable by others")


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler here")
def test_the_cache_directory_is_created_private_and_used(fresh, tmp_path):
    d = tmp_path / "new" / "cache"
    fresh(d)
    assert native.library() is not None
    st = os.lstat(d)
    assert st.st_mode & 0o777 == 0o700 and st.st_uid == os.getuid()


def _cc_spy(tmp_path):
    marker = tmp_path / "cc-was-run"
    spy = tmp_path / "spy-cc"
    spy.write_text(f'#!/bin/sh\ntouch {marker}\nexec cc "$@"\n')
    spy.chmod(0o700)
    return spy, marker


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler here")
def test_cc_is_ignored_unless_a_setting_asks_for_it(fresh, tmp_path, monkeypatch):
    spy, marker = _cc_spy(tmp_path)
    monkeypatch.setenv("CC", str(spy))
    fresh(tmp_path / "one")
    assert native.library() is not None
    assert not marker.exists()

    fresh(tmp_path / "two")
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setenv("COMPACTMQ_NATIVE_USE_CC", "true")
    assert native.library() is not None
    assert marker.exists()
