"""Key and token tools (compactmq.auth.tokens): the key URL forms, key pairs, relative times."""

from __future__ import annotations

import base64

import jwt
import pytest

from compactmq.auth import tokens
from compactmq.errors import InvalidConfiguration, InvalidInput


def test_read_key_data_forms(tmp_path, monkeypatch):
    raw = b"\x00\x01secret\xff"
    path = tmp_path / "secret.key"
    path.write_bytes(raw)
    b64 = base64.b64encode(raw).decode()
    assert tokens.read_key_data(f"file://{path}") == raw
    assert tokens.read_key_data(f"data:;base64,{b64}") == raw
    assert tokens.read_key_data(f"data:base64,{b64}") == raw  # the older spelling
    assert tokens.read_key_data(str(path)) == raw
    assert tokens.read_key_data(b64) == raw
    monkeypatch.chdir(tmp_path)  # relative paths resolve against the current directory
    assert tokens.read_key_data("file://secret.key") == raw
    assert tokens.read_key_data("secret.key") == raw


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "tokenSecretKey is empty"),
        ("file:///no/such/file", "cannot read /no/such/file"),
        ("data:;base64,***", "not valid base64"),
        ("data:nocomma", "needs a ','"),
        ("not base64 and not a file!", "not a file:// or data: URL"),
    ],
)
def test_read_key_data_errors_name_the_key_not_the_value(spec, message):
    with pytest.raises(InvalidConfiguration, match=message) as info:
        tokens.read_key_data(spec, "tokenSecretKey")
    if len(spec) > 3:
        assert spec not in str(info.value) or spec.startswith("file:")


@pytest.mark.parametrize("algorithm", ["RS256", "ES256", "ES384"])
def test_key_pairs_sign_and_verify(algorithm):
    private_der, public_der = tokens.create_key_pair(algorithm)
    private = tokens.load_private_key(private_der)
    public = tokens.load_public_key(public_der)
    assert tokens.default_algorithm_for_key(private) == algorithm
    token = tokens.create_token("alice", private, expires_in=60, headers={"kid": "k1"})
    header, payload, _ = tokens.split_token(token)
    assert header["alg"] == algorithm and header["kid"] == "k1"
    assert payload["sub"] == "alice" and isinstance(payload["exp"], int)
    assert tokens.verify_token(token, public)["sub"] == "alice"
    with pytest.raises(InvalidInput, match="cannot sign HS256"):
        tokens.create_token("alice", private, algorithm="HS256")


def test_secret_key_tokens_and_no_algorithm_confusion():
    secret = tokens.create_secret_key()
    assert len(secret) == 32 and len(tokens.create_secret_key("HS512")) == 64
    token = tokens.create_token("bob", secret)
    assert "exp" not in tokens.split_token(token)[1]
    assert tokens.verify_token(token, secret)["sub"] == "bob"
    # a token signed with HS256 using a public key's bytes as the secret must not verify
    _, public_der = tokens.create_key_pair("RS256")
    forged = _hs256_by_hand({"sub": "root"}, public_der)
    with pytest.raises(jwt.InvalidAlgorithmError):
        tokens.verify_token(forged, tokens.load_public_key(public_der))
    unsigned = jwt.encode({"sub": "root"}, None, algorithm="none")
    with pytest.raises(jwt.InvalidTokenError):
        tokens.verify_token(unsigned, secret)


def _hs256_by_hand(payload: dict, secret: bytes) -> str:
    """A token PyJWT would refuse to make (it rejects asymmetric keys as HMAC secrets)."""
    import hashlib
    import hmac
    import json

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    header = {"alg": "HS256", "typ": "JWT"}
    signing_input = b64(json.dumps(header).encode()) + "." + b64(json.dumps(payload).encode())
    return signing_input + "." + b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())


@pytest.mark.parametrize(
    "text, seconds",
    [("30", 30), ("30s", 30), ("10m", 600), ("1h", 3600), ("7d", 604800), ("2w", 1209600), ("1y", 31536000)],
)
def test_relative_time(text, seconds):
    assert tokens.parse_relative_time(text) == seconds


@pytest.mark.parametrize("text", ["", "1x", "-1h", "h", "1.5h"])
def test_relative_time_errors(text):
    with pytest.raises(InvalidInput, match="invalid time"):
        tokens.parse_relative_time(text)


@pytest.mark.parametrize("token", ["abc", "a.b", "a.b.c", "e30.bm90LWpzb24.x"])
def test_split_token_rejects_non_jwts(token):
    with pytest.raises(InvalidInput, match="not a JWT"):
        tokens.split_token(token)


def test_pem_keys_are_read_too(tmp_path):
    from security.helpers import ec_key_pair

    pair = ec_key_pair()
    assert tokens.default_algorithm_for_key(tokens.load_public_key(pair.public_pem)) == "ES256"
    assert tokens.default_algorithm_for_key(tokens.load_private_key(pair.private_pem)) == "ES256"
    with pytest.raises(InvalidConfiguration, match="not a DER or PEM public key"):
        tokens.load_public_key(b"garbage")
