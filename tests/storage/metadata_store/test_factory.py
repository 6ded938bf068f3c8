"""Choosing a store by metadataStoreUrl: schemes, URL validation, the embedded default."""

from __future__ import annotations

import pytest

from compactmq.errors import InvalidConfiguration
from compactmq.storage.metadata_store import create_metadata_store, store_from_config
from compactmq.storage.metadata_store.memory import MemoryMetadataStore
from compactmq.storage.metadata_store.sqlite import SqliteMetadataStore
from compactmq.storage.metadata_store.zookeeper import parse_zk_url


def test_no_url_is_the_embedded_store_in_the_data_dir(tmp_path):
    with create_metadata_store(None, data_dir=tmp_path) as store:
        assert isinstance(store, SqliteMetadataStore)
        assert store.path == (tmp_path / "metadata.db").resolve()
        store.put("/a", b"1")
    with create_metadata_store("", data_dir=tmp_path) as store:  # Pulsar's empty key = default
        assert store.get("/a").value == b"1"  # durable across reopen


def test_store_from_config_uses_pulsar_keys(tmp_path):
    conf = {"dataDir": str(tmp_path), "metadataStoreUrl": "memory:", "configurationMetadataStoreUrl": ""}
    with store_from_config(conf) as store:
        assert isinstance(store, MemoryMetadataStore)
    conf["configurationMetadataStoreUrl"] = "sqlite:config.db"
    with store_from_config(conf, configuration=True) as store:
        assert isinstance(store, SqliteMetadataStore) and store.path.name == "config.db"


@pytest.mark.parametrize(
    "url, words",
    [
        ("etcd:http://x:2379", "unknown scheme"),
        ("rocksdb:/tmp/x", "unknown scheme"),
        ("nonsense", "unknown scheme"),
        ("sqlite:", "needs a file name"),
        ("sqlite:../outside.db", "inside dataDir"),
        ("sqlite:/etc/passwd", "inside dataDir"),
        ("sqlite:.", "directory"),
        ("memory:a/b", "name is"),
        ("zk:", "needs host:port"),
        ("zk:host:99999", "not host:port"),
        ("zk:host:2181,:2181", "not host:port"),
        ("zk:ho st:2181", "not host:port"),
        ("zk:h:2181/chroot/", "bad chroot"),
    ],
)
def test_bad_urls_are_one_line_errors(tmp_path, url, words):
    with pytest.raises(InvalidConfiguration) as err:
        create_metadata_store(url, data_dir=tmp_path)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_bad_timeouts(tmp_path):
    with pytest.raises(InvalidConfiguration):
        create_metadata_store("memory:", data_dir=tmp_path, session_timeout_ms=0)


def test_sqlite_path_inside_data_dir_may_be_absolute(tmp_path):
    target = tmp_path / "sub" / "m.db"
    with create_metadata_store(f"sqlite:{target}", data_dir=tmp_path) as store:
        assert store.path == target.resolve()


@pytest.mark.parametrize(
    "url, hosts, chroot",
    [
        ("h:2181", "h:2181", ""),
        ("//h1:2181,h2:2182/pulsar/a", "h1:2181,h2:2182", "/pulsar/a"),
        ("10.0.0.1:2181", "10.0.0.1:2181", ""),
        ("[::1]:2181/c", "[::1]:2181", "/c"),
    ],
)
def test_zk_urls(url, hosts, chroot):
    assert parse_zk_url(url) == (hosts, chroot)


def test_zk_unreachable_is_store_unavailable(tmp_path):
    from compactmq.storage.metadata_store import StoreUnavailable

    from .zk_server import free_port

    with pytest.raises(StoreUnavailable):
        create_metadata_store(f"zk:127.0.0.1:{free_port()}", data_dir=tmp_path, operation_timeout_s=1)


def test_missing_optional_package_says_what_to_install(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "kazoo", None)  # as if kazoo were not installed
    monkeypatch.delitem(sys.modules, "compactmq.storage.metadata_store.zookeeper", raising=False)
    with pytest.raises(InvalidConfiguration) as err:
        create_metadata_store("zk:127.0.0.1:2181", data_dir=tmp_path)
    assert "pip install kazoo" in str(err.value)
