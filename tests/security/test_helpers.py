"""The test material itself: certificates that the ssl module accepts and verifies, tokens that
decode, htpasswd entries that verify. If these break, every security test breaks with them."""

from __future__ import annotations

import socket
import ssl
import threading

import bcrypt
import jwt
import pytest

from .helpers import (
    APR1,
    BCRYPT,
    CRYPT,
    KEY_PKCS1,
    ec_key_pair,
    htpasswd_hash,
    mint_token,
    rsa_key_pair,
    secret_key,
    write_htpasswd,
)


def _handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> dict | None:
    """Run one TLS handshake over a socket pair; return the server's view of the client cert."""
    a, b = socket.socketpair()
    result: dict = {}

    def serve():
        try:
            with server_ctx.wrap_socket(a, server_side=True) as s:
                result["peer"] = s.getpeercert()
                s.recv(1)
        except (ssl.SSLError, OSError) as e:
            result["error"] = e

    t = threading.Thread(target=serve)
    t.start()
    try:
        with client_ctx.wrap_socket(b, server_hostname="localhost") as c:
            c.sendall(b"x")
    except (ssl.SSLError, OSError) as e:
        result.setdefault("client_error", e)
    t.join(10)
    if "error" in result:
        raise result["error"]
    return result.get("peer")


def _server_ctx(pki, files) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(files.cert, files.key)
    ctx.load_verify_locations(pki.ca.cert_path)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _client_ctx(pki, client=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    if client is not None:
        ctx.load_cert_chain(client.cert, client.key)
    return ctx


@pytest.mark.parametrize("server", ["server", "server_pkcs1"])
def test_client_cert_verifies_and_carries_its_cn(pki, server):
    files = getattr(pki, server)
    if server == "server_pkcs1":
        assert files.key.read_text().startswith("-----BEGIN RSA PRIVATE KEY-----")
    else:
        assert files.key.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    peer = _handshake(_server_ctx(pki, files), _client_ctx(pki, pki.client("alice")))
    subject = dict(pair[0] for pair in peer["subject"])
    assert subject["commonName"] == "alice"


def test_untrusted_client_cert_is_refused(pki):
    with pytest.raises(ssl.SSLError):
        _handshake(_server_ctx(pki, pki.server), _client_ctx(pki, pki.untrusted_client("mallory")))


def test_pkcs1_client_key(pki):
    files = pki.client("bob", key_format=KEY_PKCS1)
    assert files.key.read_text().startswith("-----BEGIN RSA PRIVATE KEY-----")
    assert pki.client("bob", key_format=KEY_PKCS1) is files  # issued once


def test_tokens_decode_with_their_keys():
    secret = secret_key()
    token = mint_token("alice", secret, expires_in=60, claims={"aud": "broker"})
    assert jwt.decode(token, secret, algorithms=["HS256"], audience="broker")["sub"] == "alice"
    for pair in (rsa_key_pair(), ec_key_pair()):
        token = mint_token("bob", pair, headers={"kid": "k1"})
        assert jwt.get_unverified_header(token)["alg"] == pair.algorithm
        assert jwt.decode(token, pair.public_key, algorithms=[pair.algorithm])["sub"] == "bob"
    with pytest.raises(jwt.ExpiredSignatureError):
        jwt.decode(mint_token("x", secret, expires_in=-10), secret, algorithms=["HS256"])


def test_htpasswd_entries(tmp_path):
    from passlib.hash import apr_md5_crypt, des_crypt

    assert bcrypt.checkpw(b"pw", ("$2b$" + htpasswd_hash("pw", BCRYPT)[4:]).encode())
    assert htpasswd_hash("pw", APR1).startswith("$apr1$")
    assert apr_md5_crypt.verify("pw", htpasswd_hash("pw", APR1))
    assert des_crypt.verify("pw", htpasswd_hash("pw", CRYPT))
    path = write_htpasswd(tmp_path / ".htpasswd", {"a": "1", "b": ("2", APR1)})
    lines = path.read_text().splitlines()
    assert lines[0].startswith("a:$2y$") and lines[1].startswith("b:$apr1$")
