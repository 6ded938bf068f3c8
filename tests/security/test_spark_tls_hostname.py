"""The Spark source's binary client checks the broker's host name over pulsar+ssl:// by default.

The broker's certificate is trusted (signed by the test CA) but names ``other.example``, not
``localhost``: the client the Spark source opens (``spark.broker.open_client``, the real
pulsar-client) must refuse it, before it sends its token, unless the options turn the check off
(``tlsHostnameVerificationEnable=false``, the Java client's name, or ``tlsValidateHostname``).
"""

from __future__ import annotations

import time

import pulsar
import pytest

from broker.conftest import BrokerProcess, free_port  # tests/ is on sys.path
from compactmq.spark.broker import open_client
from compactmq.spark.options import admin_ssl_context, client_kwargs

from .helpers import file_url, mint_token, secret_key

TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


@pytest.fixture(scope="module")
def misnamed(tmp_path_factory, pki):
    """A TLS broker whose (trusted) certificate names another host."""
    directory = tmp_path_factory.mktemp("tls-hostname")
    secret = secret_key()
    (directory / "secret.key").write_bytes(secret)
    cert = pki.ca.issue("elsewhere", hosts=("other.example",), server=True, stem="elsewhere")
    tls_port = free_port()
    token = mint_token("admin", secret)
    broker = BrokerProcess(
        directory / "data",
        {
            "authenticationEnabled": "true",
            "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
            "superUserRoles": "admin",
            "tokenSecretKey": file_url(directory / "secret.key"),
            "brokerServicePortTls": str(tls_port),
            "tlsCertificateFilePath": str(cert.cert),
            "tlsKeyFilePath": str(cert.key),
            "tlsTrustCertsFilePath": str(pki.ca.cert_path),
            # the standalone creates public/default only through a client allowed to (as Pulsar's)
            "brokerClientAuthenticationPlugin": TOKEN_PLUGIN,
            "brokerClientAuthenticationParameters": f"token:{token}",
        },
    )
    broker.start()  # on a retry the port was picked again: read it back
    yield broker, int(broker.overrides["brokerServicePortTls"]), token
    broker.stop()


def _options(pki, token: str, **extra: str) -> dict:
    return {
        "authPluginClassName": TOKEN_PLUGIN,
        "authParams": f"token:{token}",
        "tlsTrustCertsFilePath": str(pki.ca.cert_path),
        "operationTimeoutSeconds": "5",
        **extra,
    }


def _produce(client: pulsar.Client) -> None:
    producer = client.create_producer(f"persistent://public/default/tls-host-{time.monotonic_ns()}")
    producer.send(b"x")


def test_a_certificate_for_another_host_is_refused_by_default(misnamed, pki):
    _, tls_port, token = misnamed
    client = open_client(f"pulsar+ssl://localhost:{tls_port}", _options(pki, token))
    try:
        with pytest.raises(pulsar.PulsarException):
            _produce(client)
    finally:
        client.close()


@pytest.mark.parametrize("switch", ["tlsHostnameVerificationEnable", "tlsValidateHostname"])
def test_the_check_can_be_turned_off_explicitly(misnamed, pki, switch):
    _, tls_port, token = misnamed
    client = open_client(f"pulsar+ssl://localhost:{tls_port}", _options(pki, token, **{switch: "false"}))
    try:
        _produce(client)
    finally:
        client.close()


def test_options_default_to_checking_and_admin_calls_follow_the_same_switch(pki):
    assert client_kwargs({})["tls_validate_hostname"] is True
    assert client_kwargs({"tlsHostnameVerificationEnable": "false"})["tls_validate_hostname"] is False
    assert client_kwargs({"tlsAllowInsecureConnection": "true"})["tls_validate_hostname"] is False
    trust = {"tlsTrustCertsFilePath": str(pki.ca.cert_path)}
    assert admin_ssl_context(trust).check_hostname is True
    assert admin_ssl_context({**trust, "tlsHostnameVerificationEnable": "false"}).check_hostname is False
