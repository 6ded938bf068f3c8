"""How the entry reader connects (``broker_connect``): service URLs, credentials from the
``pulsar.client.*`` options, TLS contexts from real certificate files the test makes, the rule for
file options, and secrets kept out of reprs and messages (plain Python: no Spark, no broker)."""

from __future__ import annotations

import ssl

import pytest
from security.helpers import make_pki  # tests/ is on sys.path

from compactmq.errors import InvalidConfiguration
from compactmq.spark.broker_connect import Unsupported, address, connection
from compactmq.spark.options import ClientOptions, parse_read_options

TOKEN = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXJvbGU.s3cr3t-signature"
TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_service_urls():
    assert address("pulsar://h:1234") == ("h", 1234, False)
    assert address("pulsar+ssl://broker.example") == ("broker.example", 6651, True)
    assert address("pulsar://a:1,b:2/") == ("a", 1, False)
    assert address("pulsar+ssl://[::1]:7000") == ("::1", 7000, True)
    for bad in ("http://h:80", "h:6650", "pulsar://h:port", "pulsar://"):
        with pytest.raises(InvalidConfiguration, match="service.url"):
            address(bad)


def test_credentials_as_the_clients_send_them():
    token = connection("pulsar://h:1", {"authPluginClassName": TOKEN_PLUGIN, "authParams": f"token:{TOKEN}"})
    assert (token.method, token.credential, token.tls) == ("token", TOKEN.encode(), None)
    assert connection("pulsar://h:1", {"authPluginClassName": "token", "authParams": TOKEN}).credential == (
        TOKEN.encode()
    )
    basic = connection(
        "pulsar://h:1",
        {"authPluginClassName": "AuthenticationBasic", "authParams": '{"userId": "u", "password": "pw1"}'},
    )
    assert (basic.method, basic.credential) == ("basic", b"u:pw1")
    assert connection("pulsar://h:1", {"operationTimeoutMs": "2500"}).timeout == 2.5
    with pytest.raises(Unsupported):  # another plugin: the official client loads it
        connection("pulsar://h:1", {"authPluginClassName": "org.example.Kerberos", "authParams": "x"})
    with pytest.raises(Unsupported):  # an option only the client applies
        connection("pulsar://h:1", {"statsIntervalSeconds": "5"})
    with pytest.raises(InvalidConfiguration, match="token:<the token>"):
        connection("pulsar://h:1", {"authPluginClassName": TOKEN_PLUGIN, "authParams": "token:"})
    with pytest.raises(InvalidConfiguration, match="needs pulsar.client.authPluginClassName"):
        connection("pulsar://h:1", {"authParams": TOKEN})


def test_tls_contexts_from_the_options(pki):
    trust = {"tlsTrustCertsFilePath": str(pki.ca.cert_path)}
    ctx = connection("pulsar+ssl://h", trust).tls
    assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    assert len(ctx.get_ca_certs()) == 1  # the test CA only, not the system store
    for switch in ("tlsHostnameVerificationEnable", "tlsValidateHostname"):
        ctx = connection("pulsar+ssl://h", {**trust, switch: "false"}).tls
        assert not ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    ctx = connection("pulsar+ssl://h", {"tlsAllowInsecureConnection": "true"}).tls
    assert ctx.verify_mode == ssl.CERT_NONE
    carol = pki.client("carol")
    tls_auth = connection(
        "pulsar+ssl://h",
        {
            **trust,
            "authPluginClassName": "org.apache.pulsar.client.impl.auth.AuthenticationTls",
            "authParams": f"tlsCertFile:{carol.cert},tlsKeyFile:{carol.key}",
        },
    )
    assert tls_auth.method == "tls" and tls_auth.tls is not None
    assert connection("pulsar://h", trust).tls is None  # plain URL: no TLS whatever the options


def test_file_options_are_plain_paths_to_files_and_never_echoed(pki, tmp_path):
    with pytest.raises(InvalidConfiguration, match="must be a file path"):
        connection("pulsar+ssl://h", {"tlsTrustCertsFilePath": "http://evil.example/ca.pem"})
    with pytest.raises(InvalidConfiguration, match="no readable file"):
        connection("pulsar+ssl://h", {"tlsTrustCertsFilePath": str(tmp_path / "missing.pem")})
    with pytest.raises(InvalidConfiguration, match="no readable file"):
        connection("pulsar+ssl://h", {"tlsTrustCertsFilePath": str(tmp_path)})  # a directory
    not_pem = tmp_path / "secret.txt"
    not_pem.write_text("top-secret-contents\n")
    with pytest.raises(InvalidConfiguration) as e:
        connection("pulsar+ssl://h", {"tlsTrustCertsFilePath": str(not_pem)})
    assert "top-secret-contents" not in str(e.value) and "tlsTrustCertsFilePath" in str(e.value)


def test_secrets_stay_out_of_reprs_and_messages():
    options = {
        "service.url": "pulsar+ssl://h:6651",
        "topic": "t",
        "pulsar.client.authPluginClassName": TOKEN_PLUGIN,
        "pulsar.client.authParams": f"token:{TOKEN}",
    }
    opts = parse_read_options(options)
    assert isinstance(opts.client, ClientOptions)
    assert opts.client["authparams"] == f"token:{TOKEN}"  # the value itself is intact (keys lower-cased)
    for text in (repr(opts), str(opts), repr(opts.client), f"{opts.client}", repr(("broker", opts.client))):
        assert TOKEN not in text and "***" in text
    conn = connection("pulsar://h:1", opts.client)
    assert TOKEN not in repr(conn)
    assert conn.scrub(f"the broker said: bad token {TOKEN}") == "the broker said: bad token ***"
    basic = connection(
        "pulsar://h:1", {"authPluginClassName": "basic", "authParams": "userId:u,password:pw-9"}
    )
    assert "pw-9" not in basic.scrub("refused u:pw-9 and pw-9") and "pw-9" not in repr(basic)
