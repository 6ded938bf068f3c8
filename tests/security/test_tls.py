"""TLS on the binary port and the web port, beside the plain ports, with the official client.

The broker runs as ``compactmq standalone`` with Pulsar's keys (``brokerServicePortTls``,
``webServicePortTls``, ``tlsCertificateFilePath``, ...) and certificates made by
``helpers`` for this run. What must hold: a client that trusts the broker's CA produces and
consumes over ``pulsar+ssl://`` (its lookup is answered with the TLS URL, or the client would
fail), the plain port keeps working, HTTPS serves the admin API, a client that does not trust
the CA cannot connect, client certificates are required when the operator says so, and a bad
TLS key or file stops the broker at start with one line.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
import urllib.request

import pulsar
import pytest

from broker.conftest import ROOT, BrokerProcess, free_port, make_client  # tests/ is on sys.path

from compactmq.config import PROVIDER_TLS
from compactmq.protocol import frames
from compactmq.protocol import pulsar_pb2 as pb
from tests.protocol import client_commands as commands

from .helpers import KEY_PKCS1
import children  # tests/ is on sys.path


#: the official client's operation timeout where the broker refuses it: the client retries
#: until it runs out, so this is what each refusal costs; a broker that wrongly accepted
#: would answer in milliseconds, well inside it
REFUSED_TIMEOUT = 1


def tls_overrides(pki, *, key_format: str = "pkcs8", **extra: str) -> dict[str, str]:
    server = pki.server_pkcs1 if key_format == KEY_PKCS1 else pki.server
    return {
        "brokerServicePortTls": str(free_port()),
        "webServicePortTls": str(free_port()),
        "tlsCertificateFilePath": str(server.cert),
        "tlsKeyFilePath": str(server.key),
        "tlsTrustCertsFilePath": str(pki.ca.cert_path),
        **extra,
    }


def tls_url(broker: BrokerProcess) -> str:
    return f"pulsar+ssl://localhost:{broker.overrides['brokerServicePortTls']}"


def https_url(broker: BrokerProcess) -> str:
    return f"https://localhost:{broker.overrides['webServicePortTls']}"


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory, pki):
    # PKCS#1 key ("BEGIN RSA PRIVATE KEY"): the other format is covered by the mTLS broker below
    b = BrokerProcess(tmp_path_factory.mktemp("tls") / "data", tls_overrides(pki, key_format=KEY_PKCS1))
    b.start()
    yield b
    b.stop()


@pytest.fixture
def topic(request):
    return f"persistent://public/default/{request.node.name}-{time.monotonic_ns()}"


def produce_and_consume(client: pulsar.Client, topic: str, n: int = 5) -> list[bytes]:
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic)
    for i in range(n):
        producer.send(f"m{i}".encode())
    got = []
    for _ in range(n):
        msg = consumer.receive(10_000)
        consumer.acknowledge(msg)
        got.append(msg.data())
    producer.close()
    consumer.close()
    return got


def test_produce_consume_and_read_over_tls_with_hostname_validation(tls_broker, pki, topic):
    client = make_client(
        tls_url(tls_broker), tls_trust_certs_file_path=str(pki.ca.cert_path), tls_validate_hostname=True
    )
    try:
        assert produce_and_consume(client, topic) == [f"m{i}".encode() for i in range(5)]
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert reader.read_next(10_000).data() == b"m0"
        reader.close()
    finally:
        client.close()


def test_plain_port_serves_beside_the_tls_port(tls_broker, topic):
    client = make_client(tls_broker.url)
    try:
        assert produce_and_consume(client, topic, 2) == [b"m0", b"m1"]
    finally:
        client.close()


def test_table_view_over_tls(tls_broker, pki, topic):
    client = make_client(tls_url(tls_broker), tls_trust_certs_file_path=str(pki.ca.cert_path))
    try:
        producer = client.create_producer(topic)
        producer.send(b"v1", partition_key="k")
        producer.send(b"v2", partition_key="k")
        view = client.create_table_view(topic)
        deadline = time.monotonic() + 10
        while view.get("k") != b"v2" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert view.get("k") == b"v2"
        view.close()
    finally:
        client.close()


def test_https_admin_api_with_the_broker_ca(tls_broker, pki):
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    with urllib.request.urlopen(https_url(tls_broker) + "/admin/v2/clusters", context=ctx, timeout=10) as r:
        assert json.loads(r.read()) == ["standalone"]
    # a client that does not trust the broker's CA refuses the server
    with pytest.raises(urllib.error.URLError) as e:
        urllib.request.urlopen(
            https_url(tls_broker) + "/admin/v2/clusters",
            context=ssl.create_default_context(cafile=str(pki.untrusted_ca.cert_path)),
            timeout=10,
        )
    assert isinstance(e.value.reason, ssl.SSLCertVerificationError)


def test_client_that_does_not_trust_the_broker_cannot_connect(tls_broker, pki, topic):
    client = make_client(
        tls_url(tls_broker),
        tls_trust_certs_file_path=str(pki.untrusted_ca.cert_path),
        operation_timeout_seconds=REFUSED_TIMEOUT,
    )
    try:
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(topic)
    finally:
        client.close()


def test_ready_line_and_lookup_name_the_tls_urls(tls_broker, pki):
    # the official client over TLS follows brokerServiceUrlTls from the lookup answer; check the
    # answer itself with the sans-I/O codec over a raw TLS socket
    from compactmq.protocol import frames
    from tests.protocol import client_commands as commands

    port = int(tls_broker.overrides["brokerServicePortTls"])
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as s,
    ):
        s.sendall(frames.encode_command(commands.connect()))
        s.sendall(frames.encode_command(commands.lookup("persistent://public/default/x", 1)))
        decoder, got = frames.FrameDecoder(), []
        while len(got) < 2:
            got += decoder.feed(s.recv(65536))
    lookup = got[1].command.lookupTopicResponse
    assert lookup.brokerServiceUrl == f"pulsar://127.0.0.1:{tls_broker.port}"
    assert lookup.brokerServiceUrlTls == f"pulsar+ssl://127.0.0.1:{port}"


# --- tlsAllowInsecureConnection ------------------------------------------------------------


@pytest.fixture(scope="module")
def insecure_broker(tmp_path_factory, pki):
    # the TLS provider on, an anonymous role for clients that prove nothing, no authorization
    b = BrokerProcess(
        tmp_path_factory.mktemp("insecure") / "data",
        tls_overrides(
            pki,
            tlsAllowInsecureConnection="true",
            authenticationEnabled="true",
            authenticationProviders=PROVIDER_TLS,
            anonymousUserRole="anonymous",
        ),
    )
    b.start()
    yield b
    b.stop()


def test_allow_insecure_connection_accepts_a_client_certificate_that_does_not_verify(
    insecure_broker, tls_broker, pki, topic
):
    """As in Pulsar: a client whose certificate does not chain to tlsTrustCertsFilePath connects
    (without the setting its handshake fails), but that certificate authenticates nobody."""
    ca, stranger = str(pki.ca.cert_path), pki.untrusted_client("app")
    presents = {
        "tls_trust_certs_file_path": ca,
        "tls_certificate_file_path": str(stranger.cert),
        "tls_private_key_file_path": str(stranger.key),
    }
    client = make_client(tls_url(tls_broker), operation_timeout_seconds=REFUSED_TIMEOUT, **presents)
    try:
        with pytest.raises(pulsar.PulsarException):  # the default: the handshake refuses it
            client.create_producer(topic)
    finally:
        client.close()
    client = make_client(tls_url(insecure_broker), **presents)
    try:
        assert produce_and_consume(client, topic, 2) == [b"m0", b"m1"]  # connected, as the anonymous role
    finally:
        client.close()
    # asking for the tls method with it is refused (the official client only retries until its
    # timeout, so the answer is read on the wire): the certificate does not make anyone "app"
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(str(stranger.cert), str(stranger.key))
    port = int(insecure_broker.overrides["brokerServicePortTls"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as s,
    ):
        s.sendall(frames.encode_command(commands.connect(auth_method_name="tls")))
        decoder, got = frames.FrameDecoder(), []
        while not got and (data := s.recv(65536)):
            got += decoder.feed(data)
    assert [f.type for f in got] == [pb.BaseCommand.ERROR], got
    assert got[0].command.error.error == pb.AuthenticationError


# --- client certificates required ----------------------------------------------------------


@pytest.fixture(scope="module")
def mtls_broker(tmp_path_factory, pki):
    b = BrokerProcess(
        tmp_path_factory.mktemp("mtls") / "data",
        tls_overrides(
            pki,
            tlsRequireTrustedClientCertOnConnect="true",
            tlsProtocols="TLSv1.3",
            tlsCiphers="TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,TLS_AES_256_GCM_SHA384",
        ),
    )
    b.start()
    yield b
    b.stop()


def test_required_client_certificate(mtls_broker, pki, topic):
    ca = str(pki.ca.cert_path)
    good = pki.client("app")
    client = make_client(
        tls_url(mtls_broker),
        tls_trust_certs_file_path=ca,
        tls_certificate_file_path=str(good.cert),
        tls_private_key_file_path=str(good.key),
    )
    try:
        assert produce_and_consume(client, topic, 1) == [b"m0"]
    finally:
        client.close()
    for cert in (None, pki.untrusted_client("app")):
        kw = (
            {}
            if cert is None
            else {"tls_certificate_file_path": str(cert.cert), "tls_private_key_file_path": str(cert.key)}
        )
        client = make_client(
            tls_url(mtls_broker),
            tls_trust_certs_file_path=ca,
            operation_timeout_seconds=REFUSED_TIMEOUT,
            **kw,
        )
        try:
            with pytest.raises(pulsar.PulsarException):
                client.create_producer(topic)
        finally:
            client.close()


def _handshake(port: int, pki, max_version: ssl.TLSVersion) -> str:
    good = pki.client("app")
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    ctx.load_cert_chain(str(good.cert), str(good.key))
    ctx.maximum_version = max_version
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as s,
    ):
        return s.version()


def test_tls_protocols_are_enforced(tls_broker, mtls_broker, pki):
    # a TLS 1.2 client is fine by default, refused where tlsProtocols=TLSv1.3
    assert (
        _handshake(int(tls_broker.overrides["brokerServicePortTls"]), pki, ssl.TLSVersion.TLSv1_2)
        == "TLSv1.2"
    )
    mtls_port = int(mtls_broker.overrides["brokerServicePortTls"])
    assert _handshake(mtls_port, pki, ssl.TLSVersion.TLSv1_3) == "TLSv1.3"
    with pytest.raises(ssl.SSLError):
        _handshake(mtls_port, pki, ssl.TLSVersion.TLSv1_2)


# --- bad configuration: one line at start ---------------------------------------------------


def start_fails(tmp_path, overrides: dict[str, str]) -> str:
    cmd = [
        sys.executable,
        "-m",
        "compactmq.cli.main",
        "standalone",
        "--data-dir",
        str(tmp_path / "data"),
        "--broker-port",
        str(free_port()),
        "--web-port",
        str(free_port()),
    ]
    for k, v in overrides.items():
        cmd += ["--config-override", f"{k}={v}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr
    assert lines[-1].startswith("compactmq: error: "), proc.stderr
    return lines[-1]


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            {"tlsKeyFilePath": "/nonexistent/broker.key"},
            "tlsKeyFilePath /nonexistent/broker.key: no such file",
        ),
        ({"tlsCertificateFilePath": ""}, "tlsCertificateFilePath is empty"),
        ({"tlsKeyFilePath": "CA"}, "no PEM private key"),
        ({"tlsKeyFilePath": "OTHER_KEY"}, "matching the certificate"),
        ({"tlsTrustCertsFilePath": "KEY"}, "no PEM certificate"),
        ({"tlsProtocols": "TLSv1.3,SSLv3"}, "tlsProtocols: unknown protocol 'SSLv3'"),
        ({"tlsCiphers": "TLS_NOPE_WITH_NOTHING"}, "tlsCiphers: cipher 'TLS_NOPE_WITH_NOTHING'"),
        (
            {"tlsTrustCertsFilePath": "", "tlsRequireTrustedClientCertOnConnect": "true"},
            "needs tlsTrustCertsFilePath",
        ),
    ],
)
def test_bad_tls_configuration_is_one_line_at_start(tmp_path, pki, change, expected):
    subst = {
        "CA": str(pki.ca.cert_path),
        "KEY": str(pki.server.key),
        "OTHER_KEY": str(pki.client("other").key),
    }
    overrides = tls_overrides(pki)
    overrides.update({k: subst.get(v, v) for k, v in change.items()})
    line = start_fails(tmp_path, overrides)
    assert expected in line, line


# --- a TLS-only broker: the plain ports off, as an empty brokerServicePort/webServicePort does ---


def _conf_file(tmp_path, settings: dict[str, str]):
    path = tmp_path / "broker.conf"
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


def _standalone(conf, data_dir) -> list[str]:
    return [
        sys.executable,
        "-m",
        "compactmq.cli.main",
        "standalone",
        "--config",
        str(conf),
        "--data-dir",
        str(data_dir),
        "--log-level",
        "WARNING",
    ]


def test_tls_only_broker_with_the_plain_ports_off(tmp_path, pki, topic):
    settings = {
        "brokerServicePort": "",
        "webServicePort": "",
        "compactionSparkWarmup": "false",
        **tls_overrides(pki),
    }
    proc = subprocess.Popen(
        _standalone(_conf_file(tmp_path, settings), tmp_path / "data"),
        **children.keep(cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True),
    )
    try:
        ready = proc.stdout.readline()
        assert "ready: broker off web off" in ready, ready
        tls_port = int(settings["brokerServicePortTls"])
        assert f"broker-tls pulsar+ssl://127.0.0.1:{tls_port}" in ready
        client = make_client(
            f"pulsar+ssl://localhost:{tls_port}", tls_trust_certs_file_path=str(pki.ca.cert_path)
        )
        try:
            assert produce_and_consume(client, topic, 3) == [b"m0", b"m1", b"m2"]
        finally:
            client.close()
        # the lookup answer names no plain URL; the client above followed the TLS one
        ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
        with (
            socket.create_connection(("127.0.0.1", tls_port), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname="localhost") as s,
        ):
            s.sendall(frames.encode_command(commands.connect()))
            s.sendall(frames.encode_command(commands.lookup(topic, 1)))
            decoder, got = frames.FrameDecoder(), []
            while len(got) < 2:
                got += decoder.feed(s.recv(65536))
        lookup = got[1].command.lookupTopicResponse
        assert lookup.brokerServiceUrl == ""
        assert lookup.brokerServiceUrlTls == f"pulsar+ssl://127.0.0.1:{tls_port}"
        web = f"https://localhost:{settings['webServicePortTls']}/admin/v2/clusters"
        with urllib.request.urlopen(web, context=ctx, timeout=10) as r:
            assert json.loads(r.read()) == ["standalone"]
    finally:
        proc.terminate()
        proc.wait(20)
        proc.stdout.close()


@pytest.mark.parametrize("plain", ["brokerServicePort", "webServicePort"])
def test_a_plain_port_off_without_its_tls_twin_is_one_line_at_start(tmp_path, plain):
    conf = _conf_file(tmp_path, {plain: "", "compactionSparkWarmup": "false"})
    proc = subprocess.run(
        _standalone(conf, tmp_path / "data"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr
    assert lines[-1] == (
        f"compactmq: error: {plain} is empty and {plain}Tls is not set: set one of them "
        f"(an empty {plain} turns the plain port off, for a TLS-only broker)"
    ), proc.stderr
