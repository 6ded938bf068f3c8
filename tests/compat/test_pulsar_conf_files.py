"""The broker starts with Pulsar's own configuration files, unmodified.

``data/pulsar-broker.conf`` and ``data/pulsar-standalone.conf`` are the key=value lines of
Pulsar's ``conf/broker.conf`` and ``conf/standalone.conf`` (the files' headers say which
commit), values unchanged. They are passed with ``--config`` as they are; what a test may not
take from them -- fixed ports 6650/8080 and ``bindAddress=0.0.0.0`` on a shared machine -- comes
from the standalone's flags, which override the file as ``bin/pulsar standalone`` options would.
Values that point at things compactmq does not have (``statusFilePath``, ``offloadersDirectory``,
``fileSystemProfilePath``, ZooKeeper and BookKeeper settings) are ignored, listed on one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from broker.conftest import BrokerProcess, make_client  # tests/ is on sys.path

from compactmq.config import parse_conf_text

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

DATA = Path(__file__).parent / "data"


def ignored_and_unknown_lines(log: str) -> tuple[list[str], list[str]]:
    lines = log.splitlines()
    ignored = [line for line in lines if "Pulsar config keys compactmq has no part for" in line]
    unknown = [line for line in lines if "unknown config keys" in line]
    return ignored, unknown


@pytest.mark.parametrize(
    "name", ["pulsar-broker.conf", "pulsar-standalone.conf", "client-python-standalone.conf"]
)
def test_broker_starts_with_pulsars_own_file(tmp_path, name):
    conf = DATA / name
    keys = parse_conf_text(conf.read_text(), name)
    assert len(keys) > 80  # the whole file, not an excerpt
    broker = BrokerProcess(tmp_path / "data", extra_args=["--config", str(conf), "--bind", "127.0.0.1"])
    broker.start()
    try:
        client = make_client(broker.url)
        try:
            topic = f"persistent://public/default/conf-{name}"
            consumer = client.subscribe(topic, "s")
            client.create_producer(topic).send(b"hello")
            assert consumer.receive(10_000).data() == b"hello"
        finally:
            client.close()
    finally:
        broker.stop()
    ignored, unknown = ignored_and_unknown_lines(broker.log_path.read_text())
    assert len(ignored) == 1  # every key of a part compactmq has not, on one line
    for key in (
        "zookeeperServers",
        "bookkeeperClientTimeoutInSeconds",
        "loadBalancerReportUpdateThresholdPercentage",
        "statusFilePath",
    ):
        assert key in ignored[0]
    assert unknown == []  # every key of Pulsar's own file is known by name


def test_an_unknown_key_is_one_warning_with_a_suggestion(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text(
        (DATA / "pulsar-standalone.conf").read_text()
        + "clientLibraryVersionCheckAllowUnversioned=true\n"
        + "brokerDeduplicationEnable=true\n"  # a typo of a key that would have taken effect
        + "someKeyOfAFutureRelease=1\n"
    )
    broker = BrokerProcess(tmp_path / "data", extra_args=["--config", str(conf), "--bind", "127.0.0.1"])
    broker.start()
    assert broker.alive()
    broker.stop()
    ignored, unknown = ignored_and_unknown_lines(broker.log_path.read_text())
    assert len(ignored) == 1 and "clientLibraryVersionCheckAllowUnversioned" in ignored[0]
    assert len(unknown) == 1
    assert (
        "ignoring 2 unknown config keys: brokerDeduplicationEnable (did you mean brokerDeduplicationEnabled?), someKeyOfAFutureRelease"
        in unknown[0]
    )
