import pytest

from compactmq.config import load_config
from compactmq.storage import Storage


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


# one real ZooKeeper server for every storage test that names it (metadata store, resources)
from .metadata_store.zk_server import zookeeper  # noqa: E402,F401
