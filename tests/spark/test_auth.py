"""The Spark source and sink against brokers with authentication, authorization and TLS on.

Credentials go through ``pulsar.client.*`` exactly as a pulsar-spark user passes them
(``authPluginClassName`` / ``authParams`` in the Java client's formats, ``tlsTrustCertsFilePath``):
the same credentials open the binary protocol and the admin REST API (``admin.url``), which plans
the read (internalStats, partitions, schema). One broker runs the token, basic and TLS providers:

* token: ``alice`` may produce and consume; ``mallory`` has no grant; a token signed with another
  key is refused (plain and TLS ports);
* basic: ``bob`` (htpasswd) may consume only;
* TLS: the client certificate with CN ``carol`` (consume only) over ``pulsar+ssl`` and ``https``.

A consume-only role plans with ``internalStats`` (Pulsar's GET_STATS topic operation, allowed to
whoever may look the topic up), so it reads in per-ledger splits cut to ``minPartitions``; an
admin API that refuses it (a proxy answering 403, standing for a stricter broker) degrades the read
to one split per partition with one warning. A second broker has no authentication and is reached
through its TLS ports only, trusting the test's CA (``tlsTrustCertsFilePath``).
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
import urllib.error
import urllib.request

import pytest
from broker.conftest import BrokerProcess, free_port, make_client  # tests/ is on sys.path
from security.helpers import every_provider_settings, make_pki, mint_token, secret_key, write_htpasswd

from .helpers import produce, read_all, rows_of

pytestmark = [pytest.mark.spark, pytest.mark.integration]

TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
BASIC_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationBasic"
TLS_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationTls"
PASSWORDS = {"bob": "bob-pw-2"}


class SecuredBroker:
    def __init__(self, directory):
        self.pki = make_pki(directory / "pki")
        self.secret = secret_key()
        (directory / "secret.key").write_bytes(self.secret)
        htpasswd = write_htpasswd(directory / "htpasswd", PASSWORDS)
        self.tls_port, self.web_tls_port = free_port(), free_port()
        settings = every_provider_settings(
            directory / "secret.key", self.secret, htpasswd, self.pki, self.tls_port
        )
        self.broker = BrokerProcess(
            directory / "data", {**settings, "webServicePortTls": str(self.web_tls_port)}
        )

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.broker.web_port}"

    def token(self, role: str) -> str:
        return mint_token(role, self.secret)

    def grant(self, role: str, actions: list[str]) -> None:
        req = urllib.request.Request(
            f"{self.admin_url}/admin/v2/namespaces/public/default/permissions/{role}",
            method="POST",
            data=json.dumps(actions).encode(),
            headers={"Authorization": f"Bearer {self.token('admin')}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10):
            pass

    def client(self, role: str = "admin"):
        import pulsar

        return make_client(self.broker.url, authentication=pulsar.AuthenticationToken(self.token(role)))

    def urls(self, tls: bool) -> dict:
        if tls:
            return {
                "service.url": f"pulsar+ssl://localhost:{self.tls_port}",
                "admin.url": f"https://localhost:{self.web_tls_port}",
                "pulsar.client.tlsTrustCertsFilePath": str(self.pki.ca.cert_path),
            }
        return {"service.url": self.broker.url, "admin.url": self.admin_url}

    def options(self, token: str, tls: bool = False) -> dict:
        o = {"pulsar.client.authPluginClassName": TOKEN_PLUGIN, "pulsar.client.authParams": f"token:{token}"}
        o.update(self.urls(tls))
        return o


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    s = SecuredBroker(tmp_path_factory.mktemp("spark-auth"))
    s.broker.start()
    s.grant("alice", ["produce", "consume"])
    s.grant("bob", ["consume"])
    s.grant("carol", ["consume"])
    yield s
    s.broker.stop()


def read(spark, options: dict, topic: str, view: str = "raw"):
    r = spark.read.format("compactmq").option("topic", topic).option("view", view)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_read_with_a_token_through_broker_and_admin(cmq_spark, secured, topic, tls):
    admin = secured.client()
    try:
        items = [(f"k{i % 4}", f"v{i}".encode()) for i in range(20)] + [(None, b"keyless")]
        produce(admin, topic, items)
        expected = sorted(read_all(admin, topic), key=lambda x: x[2:])
    finally:
        admin.close()
    opts = secured.options(secured.token("alice"), tls=tls)
    assert rows_of(read(cmq_spark, opts, topic)) == expected
    latest = read(cmq_spark, opts, topic, "latest").collect()
    assert {r["__key"]: bytes(r["value"]) for r in latest} == {
        f"k{i}": f"v{16 + i}".encode() for i in range(4)
    }


def test_a_wrong_token_fails_with_a_clear_error(cmq_spark, secured, topic):
    other_key = mint_token("alice", secret_key())
    with pytest.raises(Exception, match=r"HTTP 401 authentication failed"):
        read(cmq_spark, secured.options(other_key), topic).collect()
    # without admin.url the binary protocol refuses the token
    opts = {k: v for k, v in secured.options(other_key).items() if k != "admin.url"}
    opts["pulsar.client.operationTimeoutMs"] = "3000"  # the client retries a refused token until then
    with pytest.raises(Exception, match=r"looking up .* failed: .*check service.url and the pulsar.client"):
        read(cmq_spark, opts, topic).collect()


def test_a_role_without_grant_is_not_authorized(cmq_spark, secured, topic):
    with pytest.raises(Exception, match=r"HTTP 403 not authorized"):
        read(cmq_spark, secured.options(secured.token("mallory")), topic).collect()


def test_write_with_a_token(cmq_spark, secured, topic):
    df = cmq_spark.createDataFrame(
        [(f"w{i}".encode(), f"k{i}") for i in range(10)], "value binary, __key string"
    )
    w = df.write.format("compactmq").option("topic", topic)
    for k, v in secured.options(secured.token("alice")).items():
        w = w.option(k, v)
    w.mode("append").save()
    admin = secured.client()
    try:
        assert sorted((k, v) for k, v, *_ in read_all(admin, topic)) == [
            (f"k{i}", f"w{i}".encode()) for i in range(10)
        ]
    finally:
        admin.close()
    bad = df.write.format("compactmq").option("topic", topic)
    for k, v in secured.options(mint_token("alice", secret_key())).items():
        if k != "admin.url":
            bad = bad.option(k, v)
    bad = bad.option("pulsar.client.operationTimeoutMs", "3000")
    with pytest.raises(Exception, match=r"creating a producer on .* failed: .*check service.url"):
        bad.mode("append").save()


def publish(secured, topic, n: int = 40) -> list:
    """``n`` keyed messages and a keyless one, as the superuser; what a reader receives."""
    admin = secured.client()
    try:
        items = [(f"k{i % 4}", f"v{i}".encode()) for i in range(n)] + [(None, b"keyless")]
        produce(admin, topic, items)
        return sorted(read_all(admin, topic), key=lambda x: x[2:])
    finally:
        admin.close()


def test_basic_credentials_of_a_consume_only_role_read_in_splits(cmq_spark, secured, topic):
    expected = publish(secured, topic)
    opts = {
        "pulsar.client.authPluginClassName": BASIC_PLUGIN,
        "pulsar.client.authParams": json.dumps({"userId": "bob", "password": PASSWORDS["bob"]}),
        **secured.urls(tls=False),
    }
    df = read(cmq_spark, {**opts, "minPartitions": "3"}, topic)
    assert df.rdd.getNumPartitions() >= 3  # bob may read internalStats: per-ledger splits, cut to 3
    assert rows_of(df) == expected
    # the Java client's key:value form of the same credentials
    opts["pulsar.client.authParams"] = f"userId:bob,password:{PASSWORDS['bob']}"
    assert rows_of(read(cmq_spark, opts, topic, "compacted")) == expected  # never compacted: all
    opts["pulsar.client.authParams"] = json.dumps({"userId": "bob", "password": "wrong"})
    with pytest.raises(Exception, match=r"HTTP 401 authentication failed"):
        read(cmq_spark, opts, topic).collect()


def test_a_client_certificate_over_the_tls_ports(cmq_spark, secured, topic):
    expected = publish(secured, topic)
    carol = secured.pki.client("carol")  # CN=carol: consume only
    opts = {
        "pulsar.client.authPluginClassName": TLS_PLUGIN,
        "pulsar.client.authParams": f"tlsCertFile:{carol.cert},tlsKeyFile:{carol.key}",
        **secured.urls(tls=True),
    }
    df = read(cmq_spark, {**opts, "minPartitions": "2"}, topic)
    assert df.rdd.getNumPartitions() >= 2
    assert rows_of(df) == expected
    latest = read(cmq_spark, opts, topic, "latest").collect()  # strategy policy unreadable: keep-latest
    assert {r["__key"]: bytes(r["value"]) for r in latest} == {
        f"k{i}": f"v{36 + i}".encode() for i in range(4)
    }
    # the JSON form of the parameters, and a certificate whose role has no grant
    mallory = secured.pki.client("mallory")
    opts["pulsar.client.authParams"] = json.dumps(
        {"tlsCertFile": str(mallory.cert), "tlsKeyFile": str(mallory.key)}
    )
    with pytest.raises(Exception, match=r"HTTP 403 not authorized"):
        read(cmq_spark, opts, topic).collect()


def refusing_proxy(target: str) -> http.server.ThreadingHTTPServer:
    """A real HTTP server in front of the admin API that answers 403 to ``internalStats`` (as a
    broker whose authorization provider keeps stats to admins would) and forwards other GETs."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0].endswith("/internalStats"):
                status, body = 403, json.dumps({"reason": "stats are for tenant admins here"}).encode()
            else:
                auth = {k: v for k, v in self.headers.items() if k.lower() == "authorization"}
                try:
                    with urllib.request.urlopen(
                        urllib.request.Request(target + self.path, headers=auth), timeout=30
                    ) as resp:
                        status, body = resp.status, resp.read()
                except urllib.error.HTTPError as e:
                    status, body = e.code, e.read()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_refused_internal_stats_degrade_to_one_split_each(cmq_spark, secured, topic, caplog):
    from compactmq.spark.options import parse_read_options
    from compactmq.spark.source import plan_read

    req = urllib.request.Request(
        f"{secured.admin_url}/admin/v2/persistent/{topic.replace('persistent://', '')}/partitions",
        data=b"2",
        method="PUT",
        headers={"Authorization": f"Bearer {secured.token('admin')}", "Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).close()
    admin = secured.client()
    try:
        items = [(f"k{i % 8}", f"v{i}".encode()) for i in range(40)]
        produce(admin, topic, items)
    finally:
        admin.close()
    proxy = refusing_proxy(secured.admin_url)
    try:
        opts = {
            **secured.options(secured.token("alice")),
            "admin.url": f"http://127.0.0.1:{proxy.server_port}",
            "minPartitions": "4",
        }
        df = read(cmq_spark, opts, topic)
        assert df.rdd.getNumPartitions() == 2  # one per topic partition, minPartitions cannot cut
        assert sorted((r["__key"], bytes(r["value"])) for r in df.collect()) == sorted(items)
        with caplog.at_level(logging.WARNING, logger="compactmq.spark.broker"):
            splits = plan_read(parse_read_options({**opts, "topic": topic}))
        assert len(splits) == 2
        said = [r.getMessage() for r in caplog.records if "one split per topic partition" in r.getMessage()]
        assert len(said) == 1, said  # once per read, not once per partition
        assert "HTTP 403" in said[0] and "stats are for tenant admins here" in said[0]
    finally:
        proxy.shutdown()
        proxy.server_close()


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    """A broker without authentication, reached through its TLS ports only."""
    directory = tmp_path_factory.mktemp("spark-tls")
    pki = make_pki(directory / "pki")
    port, web = free_port(), free_port()
    b = BrokerProcess(
        directory / "data",
        {
            "brokerServicePortTls": str(port),
            "webServicePortTls": str(web),
            "tlsCertificateFilePath": str(pki.server.cert),
            "tlsKeyFilePath": str(pki.server.key),
            "tlsTrustCertsFilePath": str(pki.ca.cert_path),
        },
    )
    b.start()  # on a retry the ports were picked again: read them back
    port, web = b.overrides["brokerServicePortTls"], b.overrides["webServicePortTls"]
    yield {
        "service.url": f"pulsar+ssl://localhost:{port}",
        "admin.url": f"https://localhost:{web}",
        "pulsar.client.tlsTrustCertsFilePath": str(pki.ca.cert_path),
    }
    b.stop()


def test_tls_ports_with_a_trust_certificate(cmq_spark, tls_broker, topic):
    df = cmq_spark.createDataFrame(
        [(f"t{i}".encode(), f"k{i % 3}") for i in range(12)], "value binary, __key string"
    )
    w = df.write.format("compactmq").option("topic", topic)
    for k, v in tls_broker.items():
        w = w.option(k, v)
    w.mode("append").save()
    client = make_client(
        tls_broker["service.url"], tls_trust_certs_file_path=tls_broker["pulsar.client.tlsTrustCertsFilePath"]
    )
    try:
        expected = sorted(read_all(client, topic), key=lambda x: x[2:])
    finally:
        client.close()
    assert sorted((k, v) for k, v, *_ in expected) == sorted(
        (f"k{i % 3}", f"t{i}".encode()) for i in range(12)
    )
    got = read(cmq_spark, {**tls_broker, "minPartitions": "2"}, topic)
    assert got.rdd.getNumPartitions() >= 2
    assert rows_of(got) == expected
    # without the trust certificate the broker's CA is unknown: one clear line
    untrusting = {k: v for k, v in tls_broker.items() if k != "pulsar.client.tlsTrustCertsFilePath"}
    with pytest.raises(
        Exception, match=r"admin API at https://localhost:\d+ is not reachable: .*CERTIFICATE_VERIFY_FAILED"
    ):
        read(cmq_spark, untrusting, topic).collect()
