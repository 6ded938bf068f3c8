import pytest

from compactmq.config import load_config
from compactmq.storage import Storage
from compactmq.storage.metadata_store import create_metadata_store
from compactmq.storage.offload.blobstore import OffloadLocation


class FakeClock:
    """Milliseconds since the epoch, moved by hand."""

    def __init__(self, start_ms: int = 1_700_000_000_000):
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def open_storage(tmp_path, clock):
    """``open_storage(**config_overrides)`` -> Storage on tmp_path/data; closed at teardown."""
    opened = []

    def _open(read_only=False, **overrides):
        st = Storage(tmp_path / "data", load_config(overrides=overrides), clock=clock, read_only=read_only)
        opened.append(st)
        return st

    yield _open
    for st in opened:
        st.close()


@pytest.fixture
def object_location(seaweedfs, tmp_path):
    """``object_location(bucket)`` -> an S3 location in the test's SeaweedFS, under a prefix of
    this test's own (so tests sharing a bucket never see each other's keys)."""

    def _location(bucket: str) -> OffloadLocation:
        return OffloadLocation(
            "s3", seaweedfs.create_bucket(bucket), "us-east-1", seaweedfs.endpoint, tmp_path.name
        )

    return _location


@pytest.fixture
def sqlite_meta(tmp_path):
    """A real SQLite metadata store in the test's directory, closed at teardown."""
    meta = create_metadata_store(f"sqlite:{tmp_path / 'meta.db'}", data_dir=tmp_path)
    yield meta
    meta.close()


# one real ZooKeeper server for every storage test that names it (metadata store, resources)
from .metadata_store.zk_server import zookeeper  # noqa: E402,F401
