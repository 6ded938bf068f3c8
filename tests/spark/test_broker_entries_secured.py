"""Whole entries (``broker_entries``) read from a secured broker: token authentication and
authorization on, and TLS-only ports (the plain ports off), with certificates the test makes.

The broker's certificate names ``localhost`` only, so dialling ``127.0.0.1`` is a host-name
mismatch. Through Spark the read equals the official client's rows (``columnar=false``), and the
entries' ids carry the batch size the client's Python API cannot tell, which shows the entries
were read (see ``test_broker_columns.without_batch_size``). In process, a refused credential, a
role without a grant, an untrusted or misnamed certificate each fail the entry reader with one
line naming the option to set -- and the token appears in no message, repr or Spark plan.
"""

from __future__ import annotations

import json
import ssl
import urllib.request

import pulsar
import pytest
from broker.conftest import BrokerProcess, free_port, make_client  # tests/ is on sys.path
from security.helpers import file_url, make_pki, mint_token, secret_key

from .helpers import produce
from .test_broker_columns import id_of, without_batch_size

pytestmark = [pytest.mark.spark, pytest.mark.integration]

TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


class TlsOnlyBroker(BrokerProcess):
    """A broker whose plain ports are off (empty ``brokerServicePort`` / ``webServicePort``)."""

    def command(self) -> list[str]:
        cmd = super().command()
        for flag in ("--broker-port", "--web-port"):
            i = cmd.index(flag)
            del cmd[i : i + 2]
        return cmd + ["--config-override", "brokerServicePort=", "--config-override", "webServicePort="]


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    directory = tmp_path_factory.mktemp("entries-tls")
    pki = make_pki(directory / "pki")
    cert = pki.ca.issue("broker-localhost", hosts=("localhost",), server=True, stem="localhost-only")
    secret = secret_key()
    (directory / "secret.key").write_bytes(secret)
    port, web = free_port(), free_port()
    broker = TlsOnlyBroker(
        directory / "data",
        {
            "advertisedAddress": "localhost",  # the official client follows lookups to this name
            "authenticationEnabled": "true",
            "authorizationEnabled": "true",
            "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
            "superUserRoles": "admin",
            "tokenSecretKey": file_url(directory / "secret.key"),
            "brokerClientAuthenticationPlugin": TOKEN_PLUGIN,
            "brokerClientAuthenticationParameters": "token:" + mint_token("admin", secret),
            "brokerServicePortTls": str(port),
            "webServicePortTls": str(web),
            "tlsCertificateFilePath": str(cert.cert),
            "tlsKeyFilePath": str(cert.key),
            "tlsTrustCertsFilePath": str(pki.ca.cert_path),
        },
    )
    broker.start()  # on a retry the ports were picked again: read them back
    port, web = broker.overrides["brokerServicePortTls"], broker.overrides["webServicePortTls"]
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    req = urllib.request.Request(
        f"https://localhost:{web}/admin/v2/namespaces/public/default/permissions/alice",
        method="POST",
        data=json.dumps(["consume"]).encode(),
        headers={
            "Authorization": f"Bearer {mint_token('admin', secret)}",
            "Content-Type": "application/json",
        },
    )
    urllib.request.urlopen(req, timeout=10, context=ctx).close()
    yield {
        "pki": pki,
        "secret": secret,
        "url": f"pulsar+ssl://localhost:{port}",
        "port": port,
        "admin_url": f"https://localhost:{web}",
    }
    broker.stop()


def options(s, role: str = "alice", **extra) -> dict:
    return {
        "service.url": s["url"],
        "admin.url": s["admin_url"],
        "pulsar.client.tlsTrustCertsFilePath": str(s["pki"].ca.cert_path),
        "pulsar.client.authPluginClassName": TOKEN_PLUGIN,
        "pulsar.client.authParams": "token:" + mint_token(role, s["secret"]),
        "pulsar.client.operationTimeoutSeconds": "15",
        **extra,
    }


def publish(s, topic: str) -> None:
    client = make_client(
        s["url"],
        tls_trust_certs_file_path=str(s["pki"].ca.cert_path),
        authentication=pulsar.AuthenticationToken(mint_token("admin", s["secret"])),
    )
    try:
        items = [(f"k{i % 5}", f"v{i}".encode()) for i in range(120)] + [(None, b"keyless")]
        produce(client, topic, items, batching=True, properties=[{"n": str(i)} for i in range(121)])
    finally:
        client.close()


def spark_rows(spark, opts: dict, topic: str, view: str, columnar: bool) -> list:
    r = spark.read.format("compactmq").option("topic", topic).option("view", view)
    for k, v in {**opts, "columnar": str(columnar).lower()}.items():
        r = r.option(k, v)
    rows = [row.asDict() for row in r.load().collect()]
    for row in rows:
        row["__messageProperties"] = sorted((row["__messageProperties"] or {}).items())
    return sorted(rows, key=id_of)


@pytest.mark.parametrize("view", ["raw", "compacted"])
def test_entries_over_tls_with_a_token_equal_the_client_rows(cmq_spark, secured, topic, view):
    publish(secured, topic)
    opts = options(secured)
    got = spark_rows(cmq_spark, opts, topic, view, columnar=True)
    rows = spark_rows(cmq_spark, opts, topic, view, columnar=False)
    assert len(got) == 121
    assert without_batch_size(got) == rows
    assert got != rows  # the entries' ids name their batch size: read as entries, not by the client
    df = cmq_spark.read.format("compactmq").option("topic", topic)
    for k, v in opts.items():
        df = df.option(k, v)
    df = df.load()
    token = opts["pulsar.client.authParams"].removeprefix("token:")
    plan = df._jdf.queryExecution().toString()
    assert "compactmq" in plan.lower() or "python" in plan.lower()
    assert token not in plan


def split_of(secured, topic: str):
    """The first split of a raw read planned with alice's credentials (what a task receives)."""
    from compactmq.spark.options import parse_read_options
    from compactmq.spark.source import plan_read

    splits = plan_read(parse_read_options({**options(secured), "topic": topic}))
    assert splits
    return splits[0]


def entry_rows(secured, split, client: dict) -> int:
    from compactmq.spark import broker_entries

    reader = broker_entries.open_reader(split, client.pop("service.url", secured["url"]), client)
    return sum(len(cols) for cols in broker_entries.read_split_columns(reader, split))


def client_options(opts: dict) -> dict:
    return {k.removeprefix("pulsar.client."): v for k, v in opts.items() if k.startswith("pulsar.client.")}


def test_refusals_name_the_option_to_set_and_never_the_token(secured, topic):
    from compactmq.spark.broker_entries import BrokerReadError
    from compactmq.spark.source import SplitPartition

    publish(secured, topic)
    split = split_of(secured, topic)
    assert entry_rows(secured, split, client_options(options(secured))) > 0
    cases = [
        # no credential at all
        (
            {k: v for k, v in client_options(options(secured)).items() if not k.startswith("auth")},
            r"AuthenticationError .*set pulsar.client.authPluginClassName and pulsar.client.authParams",
        ),
        # a token signed with another key
        (
            {**client_options(options(secured)), "authParams": "token:" + mint_token("alice", secret_key())},
            r"AuthenticationError .*check pulsar.client.authParams",
        ),
        # a valid token of a role without a grant
        (client_options(options(secured, "mallory")), r"AuthorizationError .*consume permission"),
    ]
    for client, message in cases:
        with pytest.raises(BrokerReadError, match=message) as e:
            entry_rows(secured, split, dict(client))
        token = str(client.get("authParams", "")).removeprefix("token:")
        assert not token or token not in str(e.value)
    # the options a task receives show no token either
    opts = client_options(options(secured))
    from compactmq.spark.options import ClientOptions

    part = SplitPartition(split, ("broker", secured["url"], ClientOptions(opts), "columns"))
    assert opts["authParams"].removeprefix("token:") not in repr(part)


def test_the_broker_certificate_is_checked(secured, topic, tmp_path):
    from compactmq.spark.broker_entries import BrokerReadError

    publish(secured, topic)
    split = split_of(secured, topic)
    good = client_options(options(secured))
    # another CA's certificate as the trust file: the broker's is not trusted
    other = make_pki(tmp_path / "other")
    with pytest.raises(BrokerReadError, match=r"TLS certificate was refused .*tlsTrustCertsFilePath"):
        entry_rows(secured, split, {**good, "tlsTrustCertsFilePath": str(other.ca.cert_path)})
    # 127.0.0.1 is not a name in the certificate (localhost only): refused before any credential
    by_ip = f"pulsar+ssl://127.0.0.1:{secured['port']}"
    with pytest.raises(BrokerReadError, match=r"TLS certificate was refused .*tlsHostnameVerificationEnable"):
        entry_rows(secured, split, {**good, "service.url": by_ip})
    # ... unless the options turn the name check off (the Java client's name for the switch)
    assert entry_rows(
        secured, split, {**good, "service.url": by_ip, "tlsHostnameVerificationEnable": "false"}
    )
    # a plain pulsar:// URL to the TLS port gets no answer it can read: a clear failure, not a hang
    with pytest.raises(BrokerReadError):
        entry_rows(secured, split, {**good, "service.url": f"pulsar://localhost:{secured['port']}"})
