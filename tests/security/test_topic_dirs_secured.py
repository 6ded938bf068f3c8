"""A consume-only role cannot destroy another topic's data through a colliding name.

A topic part longer than 200 encoded characters is stored under ``enc[:150] + "~" + sha1[:16]``.
A short topic spelled exactly that way used to map to the same directory, and subscribing to
it (which creates the topic) deleted the long topic's ledgers as orphans. Here ``bob`` may only
consume; he subscribes to the short spelling and the long topic keeps every message, on disk
and through a reader, also after a restart. ``.`` and ``..`` are refused as topic names on the
wire and over REST.
"""

from __future__ import annotations

import hashlib
import os
import time
from urllib.parse import quote

import pulsar
import pytest

from broker.conftest import make_client  # tests/ is on sys.path

from .adminhttp import start_secured_broker

LONG = "long-" + "x" * 250


def spelled_like_the_long_one(local: str) -> str:
    enc = quote(local, safe="-_=:").replace(".", "%2E")
    return enc[:150] + "~" + hashlib.sha1(local.encode()).hexdigest()[:16]


@pytest.fixture(scope="module")
def secured(tmp_path_factory, pki):
    s = start_secured_broker(tmp_path_factory.mktemp("topic-dirs"), pki)
    s.as_token("admin").ok("POST", "/admin/v2/namespaces/public/default/permissions/bob", ["consume"])
    yield s
    s.broker.stop()


def _client(secured, role: str, operation_timeout_seconds: int = 10) -> pulsar.Client:
    return make_client(
        secured.broker.url,
        authentication=pulsar.AuthenticationToken(secured.token(role)),
        operation_timeout_seconds=operation_timeout_seconds,
    )


def _ledger_files(data_dir, local: str) -> list[str]:
    directory = os.path.join(
        data_dir, "ledgers", "persistent", "public", "default", spelled_like_the_long_one(local)
    )
    return sorted(n for n in os.listdir(directory) if n.endswith(".log"))


def _read_all(client: pulsar.Client, topic: str) -> list[bytes]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(10_000).data())
    reader.close()
    return got


def test_consume_only_role_subscribing_to_the_colliding_name_destroys_nothing(secured):
    long_topic = f"persistent://public/default/{LONG}-{time.monotonic_ns()}"
    local = long_topic.rsplit("/", 1)[1]
    short_topic = "persistent://public/default/" + spelled_like_the_long_one(local)
    admin = _client(secured, "admin")
    try:
        producer = admin.create_producer(long_topic)
        sent = [f"m{i}".encode() for i in range(5)]
        for m in sent:
            producer.send(m)
        producer.close()
        files_before = _ledger_files(secured.broker.data_dir, local)
        assert files_before

        bob = _client(secured, "bob")
        try:
            consumer = bob.subscribe(short_topic, "sub")  # creates the short topic
            consumer.close()
        finally:
            bob.close()
        assert set(files_before) <= set(_ledger_files(secured.broker.data_dir, local))
        assert _read_all(admin, long_topic) == sent
    finally:
        admin.close()

    secured.broker.restart()  # and the data is still there after a restart
    admin = _client(secured, "admin")
    try:
        assert _read_all(admin, long_topic) == sent
    finally:
        admin.close()


@pytest.mark.parametrize("name", [".", ".."])
def test_dot_topic_names_are_refused_on_the_wire(secured, name):
    # the official client retries the refused lookup until its operation timeout (the broker's
    # InvalidTopicName answer itself is asserted on the raw wire below): 1 s, not 10, of that
    client = _client(secured, "admin", operation_timeout_seconds=1)
    try:
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(f"persistent://public/default/{name}", send_timeout_millis=3000)
    finally:
        client.close()
    assert not os.path.exists(
        os.path.join(secured.broker.data_dir, "ledgers", "persistent", "public", "default", "%2E" * len(name))
    )


@pytest.mark.parametrize("name", ["%2E", "%2E%2E"])
def test_dot_topic_names_are_refused_over_rest(secured, name):
    status, out, _ = secured.as_token("admin").call("PUT", f"/admin/v2/persistent/public/default/{name}")
    assert 400 <= status < 500, (status, out)
    assert not os.path.exists(
        os.path.join(
            secured.broker.data_dir, "ledgers", "persistent", "public", "default", "%2E" * (len(name) // 3)
        )
    )


@pytest.mark.parametrize("name", [".", ".."])
def test_dot_topic_names_are_invalid_topic_name_errors_on_the_raw_wire(secured, name):
    """What the official client hides: the broker's answer is ServerError InvalidTopicName."""
    import socket

    from compactmq.protocol import frames
    from compactmq.protocol import pulsar_pb2 as pb
    from tests.protocol import client_commands as commands

    with socket.create_connection(("127.0.0.1", secured.broker.port), timeout=10) as s:
        auth = secured.token("bob").encode()
        s.sendall(frames.encode_command(commands.connect(auth_method_name="token", auth_data=auth)))
        s.sendall(frames.encode_command(commands.lookup(f"persistent://public/default/{name}", 1)))
        s.sendall(frames.encode_command(commands.producer(f"persistent://public/default/{name}", 1, 2)))
        decoder, got = frames.FrameDecoder(), []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            got += decoder.feed(s.recv(65536))
    assert [f.type for f in got] == [
        pb.BaseCommand.CONNECTED,
        pb.BaseCommand.LOOKUP_RESPONSE,
        pb.BaseCommand.ERROR,
    ]
    assert got[1].command.lookupTopicResponse.error == pb.InvalidTopicName
    assert got[2].command.error.error == pb.InvalidTopicName
