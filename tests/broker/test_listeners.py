"""Advertised listeners as Pulsar has them: a client naming a listener (``listener_name``) is
sent to that listener's address, one naming none gets the internal listener, an unknown name is
refused with Pulsar's message, over the binary protocol and over HTTP; settings Pulsar refuses
stop the broker at start with one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

pulsar = pytest.importorskip("pulsar")

from .conftest import ROOT, BrokerProcess, free_port, make_client  # noqa: E402
from .rest import ok, rest, web  # noqa: E402

pytestmark = pytest.mark.integration


#: the official client's operation timeout where the broker refuses it: the client retries
#: until it runs out, so this is what each refusal costs; a broker that wrongly accepted
#: would answer in milliseconds, well inside it
REFUSED_TIMEOUT = 1


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("listeners") / "data")
    # two names for the same socket, so the address a lookup answers is visible to the test
    b.overrides = {
        "advertisedListeners": f"internal:pulsar://127.0.0.1:{b.port},external:pulsar://localhost:{b.port},"
        f"external:http://localhost:{b.web_port}",
        "internalListenerName": "internal",
    }
    b.start()
    yield b
    b.stop()


def test_lookup_answers_the_named_listener(broker, topic):
    local = topic.split("://", 1)[1]
    path = f"/lookup/v2/topic/persistent/{local}"
    assert ok(rest(broker, "GET", path))["brokerUrl"] == f"pulsar://127.0.0.1:{broker.port}"
    external = ok(rest(broker, "GET", path + "?listenerName=external"))
    assert external["brokerUrl"] == f"pulsar://localhost:{broker.port}"
    assert external["httpUrl"] == f"http://localhost:{broker.web_port}"
    status, body = rest(broker, "GET", path + "?listenerName=nope")
    assert status == 404 and body["reason"] == "the broker do not have nope listener"


def test_client_with_a_listener_name_produces_and_consumes(broker, topic):
    for name in ("external", "internal"):
        client = make_client(broker.url, listener_name=name)
        try:
            consumer = client.subscribe(topic, f"s-{name}", initial_position=pulsar.InitialPosition.Earliest)
            client.create_producer(topic).send(name.encode())
            assert consumer.receive(10000).data() in (b"external", b"internal")
        finally:
            client.close()
    http_client = make_client(web(broker), listener_name="external")
    try:
        http_client.create_producer(topic).send(b"over http")
    finally:
        http_client.close()


def test_unknown_listener_name_is_refused(broker, topic):
    client = make_client(broker.url, listener_name="nope", operation_timeout_seconds=REFUSED_TIMEOUT)
    try:
        # every lookup is refused (MetadataError, "the broker do not have nope listener"); the
        # official client retries lookups until its operation timeout, as against Pulsar
        with pytest.raises(pulsar.Timeout):
            client.create_producer(topic)
    finally:
        client.close()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"advertisedListeners": "internal:kafka://h:1"}, "not name:pulsar://host:port"),
        ({"advertisedListeners": "a:pulsar://h:1,a:pulsar://h:2"}, "two pulsar:// addresses"),
        (
            {"advertisedListeners": "a:pulsar://h:1", "internalListenerName": "b"},
            "not one of advertisedListeners",
        ),
        ({"advertisedListeners": "a:pulsar://h:1", "advertisedAddress": "h"}, "must not be set together"),
    ],
)
def test_settings_pulsar_refuses_stop_the_broker(tmp_path, overrides, message):
    cmd = [
        sys.executable,
        "-m",
        "compactmq.cli.main",
        "standalone",
        "--data-dir",
        str(tmp_path / "d"),
        "--broker-port",
        str(free_port()),
        "--web-port",
        str(free_port()),
    ]
    for k, v in overrides.items():
        cmd += ["--config-override", f"{k}={v}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
