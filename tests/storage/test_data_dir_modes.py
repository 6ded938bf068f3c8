"""A data directory is its owner's only: 0700, and the files storage creates in it 0600, even
under a permissive umask (the broker's own umask is tested in tests/security)."""

from __future__ import annotations

import os
import stat

import pytest

from compactmq.compaction.compacted_ledger import compacted_ledger_path
from compactmq.compaction.compacted_writer import CompactedLedgerWriter
from compactmq.storage.dir_owner import OWNER_FILE


@pytest.fixture
def permissive_umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def files_under(root) -> list[str]:
    return [os.path.join(d, f) for d, _, names in os.walk(root) for f in names]


def test_storage_creates_an_owner_only_data_directory(open_storage, tmp_path, permissive_umask):
    st = open_storage()
    assert mode(tmp_path / "data") == 0o700
    ml = st.open_managed_ledger("persistent://public/default/modes")
    ml.append(b"secret message")
    ml.rollover()  # a closed ledger with its index, and a new open one
    writer = CompactedLedgerWriter(
        compacted_ledger_path(st.data_dir, "persistent://public/default/modes", 99)
    )
    writer.finish()
    names = {os.path.basename(p) for p in files_under(tmp_path / "data")}
    assert {"LOCK", "metadata.db", OWNER_FILE} <= names
    assert any(n.endswith(".log") for n in names) and any(n.endswith(".idx") for n in names)
    assert any(n.endswith(".compacted") for n in names)
    loose = {p: oct(mode(p)) for p in files_under(tmp_path / "data") if mode(p) & 0o077}
    assert not loose, loose


def test_an_existing_open_data_directory_is_tightened(open_storage, tmp_path, permissive_umask):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    open_storage()
    assert mode(data) == 0o700
