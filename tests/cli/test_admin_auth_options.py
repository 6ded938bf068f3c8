"""pulsar-admin's security options as the CLI reads them: plugin names, the auth-params forms of
the token, basic and TLS plugins, and the TLS context of an https admin URL. No broker: these are
the parsing rules; ``tests/security/test_cli_auth.py`` drives a secured broker."""

from __future__ import annotations

import base64
import ssl

import pytest

from compactmq.cli.admin import AdminClient
from compactmq.cli.admin_auth import client_auth, plugin_method, ssl_context
from compactmq.cli.main import build_parser
from compactmq.errors import InvalidInput

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.c2lnbmF0dXJl"


@pytest.mark.parametrize(
    "name, method",
    [
        ("org.apache.pulsar.client.impl.auth.AuthenticationToken", "token"),
        ("org.apache.pulsar.client.impl.auth.AuthenticationTls", "tls"),
        ("org.apache.pulsar.client.impl.auth.AuthenticationBasic", "basic"),
        ("AuthenticationToken", "token"),
        ("token", "token"),
        ("TLS", "tls"),
        ("basic", "basic"),
    ],
)
def test_plugin_names(name, method):
    assert plugin_method(name) == method


def test_unknown_plugin_is_one_clear_error():
    with pytest.raises(InvalidInput, match="unsupported --auth-plugin 'kerberos'.*AuthenticationToken"):
        plugin_method("kerberos")


def test_token_params_forms(tmp_path):
    path = tmp_path / "admin.token"
    path.write_text(JWT + "\n")
    for params in (
        f"token:{JWT}",
        f"file://{path}",
        f'{{"token": "{JWT}"}}',
        f'{{"file": "file://{path}"}}',
        JWT,
    ):
        auth = client_auth("token", params)
        assert auth.authorization == f"Bearer {JWT}", params
    with pytest.raises(InvalidInput, match="cannot read the token file .*missing.token") as e:
        client_auth("token", f"file://{tmp_path}/missing.token")
    assert JWT not in str(e.value)
    with pytest.raises(InvalidInput, match="needs a token"):
        client_auth("token", "token:")


def test_basic_params_forms():
    want = "Basic " + base64.b64encode(b"alice:pa:ss").decode()
    for params in ('{"userId": "alice", "password": "pa:ss"}', "userId:alice,password:pa:ss", "alice:pa:ss"):
        assert (
            client_auth("org.apache.pulsar.client.impl.auth.AuthenticationBasic", params).authorization
            == want
        )
    with pytest.raises(InvalidInput, match="userId") as e:
        client_auth("basic", '{"userId": "alice"}')
    with pytest.raises(InvalidInput, match="not valid JSON") as e:
        client_auth("basic", '{"userId": "alice", "password": "hunter2"')
    assert "hunter2" not in str(e.value)  # the secret is never echoed


def test_tls_params_and_options():
    auth = client_auth("tls", "tlsCertFile:/c/cert.pem,tlsKeyFile:/c/key.pem")
    assert (auth.method, auth.authorization, auth.cert_file, auth.key_file) == (
        "tls",
        None,
        "/c/cert.pem",
        "/c/key.pem",
    )
    auth = client_auth("tls", None, "/o/cert.pem", "/o/key.pem")
    assert (auth.cert_file, auth.key_file) == ("/o/cert.pem", "/o/key.pem")
    with pytest.raises(InvalidInput, match="client certificate and key"):
        client_auth("tls", None)


def test_params_without_plugin_and_repr_hides_the_secret():
    with pytest.raises(InvalidInput, match="--auth-params needs --auth-plugin"):
        client_auth(None, f"token:{JWT}")
    assert JWT not in repr(client_auth("token", f"token:{JWT}"))


def test_ssl_context_options(tmp_path):
    auth = client_auth(None, None)
    strict = ssl_context(None, False, True, auth)
    assert strict.verify_mode == ssl.CERT_REQUIRED and strict.check_hostname
    pulsar_default = ssl_context(None, False, False, auth)  # Pulsar verifies the chain, not the host name
    assert pulsar_default.verify_mode == ssl.CERT_REQUIRED and not pulsar_default.check_hostname
    insecure = ssl_context(None, True, True, auth)
    assert insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname
    with pytest.raises(InvalidInput, match="cannot load --tls-trust-cert-path"):
        ssl_context(str(tmp_path / "nope.pem"), False, False, auth)


def test_global_options_reach_the_client(tmp_path):
    args = build_parser().parse_args(
        [
            "--admin-url",
            "https://127.0.0.1:8443",
            "--auth-plugin",
            "token",
            "--auth-params",
            f"token:{JWT}",
            "--tls-allow-insecure",
            "tenants",
            "list",
        ]
    )
    client = AdminClient.from_args(args)
    assert client.auth.authorization == f"Bearer {JWT}" and client.tls.verify_mode == ssl.CERT_NONE
    args = build_parser().parse_args(
        ["--auth-plugin", "tls", "--auth-params", "tlsCertFile:/a,tlsKeyFile:/b", "tenants", "list"]
    )
    with pytest.raises(InvalidInput, match="https://"):
        AdminClient.from_args(args)  # a client certificate over plain http would authenticate nothing
