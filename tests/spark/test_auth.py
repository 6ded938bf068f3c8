"""The Spark source and sink against a broker with token authentication and authorization on.

Credentials go through ``pulsar.client.*`` exactly as a pulsar-spark user passes them
(``authPluginClassName`` / ``authParams``, ``tlsTrustCertsFilePath``): the same token opens the
binary protocol and is sent as ``Authorization: Bearer`` to the admin REST API (``admin.url``),
which plans the read (internalStats, partitions, schema). ``alice`` may produce and consume in
``public/default``; ``mallory`` has no grant; a token signed with another key is refused.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from broker.conftest import BrokerProcess, free_port, make_client  # tests/ is on sys.path
from security.helpers import file_url, make_pki, mint_token, secret_key

from .helpers import produce, read_all, rows_of

pytestmark = [pytest.mark.spark, pytest.mark.integration]

TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


class SecuredBroker:
    def __init__(self, directory):
        self.pki = make_pki(directory / "pki")
        self.secret = secret_key()
        (directory / "secret.key").write_bytes(self.secret)
        self.tls_port, self.web_tls_port = free_port(), free_port()
        self.broker = BrokerProcess(
            directory / "data",
            {
                "authenticationEnabled": "true",
                "authorizationEnabled": "true",
                "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
                "superUserRoles": "admin",
                "tokenSecretKey": file_url(directory / "secret.key"),
                "brokerServicePortTls": str(self.tls_port),
                "webServicePortTls": str(self.web_tls_port),
                "tlsCertificateFilePath": str(self.pki.server.cert),
                "tlsKeyFilePath": str(self.pki.server.key),
                "tlsTrustCertsFilePath": str(self.pki.ca.cert_path),
            },
        )

    def token(self, role: str) -> str:
        return mint_token(role, self.secret)

    def grant(self, role: str, actions: list[str]) -> None:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.broker.web_port}/admin/v2/namespaces/public/default/permissions/{role}",
            method="POST",
            data=json.dumps(actions).encode(),
            headers={"Authorization": f"Bearer {self.token('admin')}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10):
            pass

    def client(self, role: str = "admin"):
        import pulsar

        return make_client(self.broker.url, authentication=pulsar.AuthenticationToken(self.token(role)))

    def options(self, token: str, tls: bool = False) -> dict:
        o = {"pulsar.client.authPluginClassName": TOKEN_PLUGIN, "pulsar.client.authParams": f"token:{token}"}
        if tls:
            o.update(
                {
                    "service.url": f"pulsar+ssl://localhost:{self.tls_port}",
                    "admin.url": f"https://localhost:{self.web_tls_port}",
                    "pulsar.client.tlsTrustCertsFilePath": str(self.pki.ca.cert_path),
                }
            )
        else:
            o.update(
                {"service.url": self.broker.url, "admin.url": f"http://127.0.0.1:{self.broker.web_port}"}
            )
        return o


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    s = SecuredBroker(tmp_path_factory.mktemp("spark-auth"))
    s.broker.start()
    s.grant("alice", ["produce", "consume"])
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
