"""``compactmq tokens``: Pulsar's verbs and options make keys and tokens the broker's token
provider accepts (HS256 secret, RS256 and ES256 key pairs), ``show`` and ``validate`` print what
Pulsar's tool prints, and mistakes are one line without the secret."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import jwt
import pytest

from compactmq.auth import AuthenticationService
from compactmq.cli.main import main
from compactmq.config import PROVIDER_TOKEN, load_config
from compactmq.errors import AuthenticationFailed

from harness.cli import run_cli


def tokens(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["tokens", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def ok(capsys, *args: str) -> str:
    rc, out, err = tokens(capsys, *args)
    assert rc == 0, (args, out, err)
    return out


def error(capsys, *args: str) -> str:
    rc, out, err = tokens(capsys, *args)
    assert rc == 1 and not out, (args, rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compactmq: error: "), err
    return lines[0]


def broker_role(token: str, **keys: str) -> str:
    config = load_config(
        overrides={"authenticationEnabled": "true", "authenticationProviders": PROVIDER_TOKEN, **keys}
    )
    return (
        AuthenticationService.from_config(config, environ={}).authenticate_http(f"Bearer {token}", None).role
    )


def test_secret_key_and_token_the_broker_accepts(tmp_path, capsys):
    key = tmp_path / "secret.key"
    assert ok(capsys, "create-secret-key", "--output", str(key)) == ""
    assert len(key.read_bytes()) == 32 and key.stat().st_mode & 0o077 == 0  # raw bytes, owner-only
    token = ok(capsys, "create", "--subject", "admin", "--secret-key", f"file://{key}").strip()
    assert jwt.get_unverified_header(token)["alg"] == "HS256"
    assert broker_role(token, tokenSecretKey=f"file://{key}") == "admin"
    # the short option names and the base64 form, as in Pulsar's docs
    b64 = tmp_path / "secret.b64"
    ok(capsys, "create-secret-key", "-o", str(b64), "-b")
    raw = base64.b64decode(b64.read_text())
    assert len(raw) == 32
    token = ok(capsys, "create", "-s", "worker", "-sk", f"data:;base64,{b64.read_text()}", "-e", "1h").strip()
    exp = jwt.decode(token, raw, algorithms=["HS256"])["exp"]
    assert time.time() + 3500 < exp <= time.time() + 3600
    assert broker_role(token, tokenSecretKey=f"data:;base64,{b64.read_text()}") == "worker"


def secret_key_on_stdout(*args: str) -> bytes:
    """What ``tokens create-secret-key`` writes to stdout, as bytes (a pipe's view of it)."""
    proc = run_cli("tokens", "create-secret-key", *args, text=False)
    assert proc.returncode == 0 and not proc.stderr, proc
    return proc.stdout


def test_secret_key_on_stdout_is_raw_or_base64():
    raw = secret_key_on_stdout()
    assert len(raw) == 32
    text = secret_key_on_stdout("--base64")
    assert len(base64.b64decode(text, validate=True)) == 32
    sized = secret_key_on_stdout("-a", "HS512")
    assert len(sized) == 64


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
def test_key_pairs_sign_tokens_the_broker_verifies(tmp_path, capsys, algorithm):
    private, public = tmp_path / "my-private.key", tmp_path / "my-public.key"
    ok(
        capsys,
        "create-key-pair",
        "--signature-algorithm",
        algorithm,
        "--output-private-key",
        str(private),
        "--output-public-key",
        str(public),
    )
    assert private.stat().st_mode & 0o077 == 0
    assert not private.read_bytes().startswith(b"-----")  # DER, as Pulsar writes them
    token = ok(capsys, "create", "--subject", "svc", "--private-key", f"file://{private}").strip()
    assert jwt.get_unverified_header(token)["alg"] == algorithm
    assert broker_role(token, tokenPublicKey=f"file://{public}", tokenPublicAlg=algorithm) == "svc"
    assert ok(capsys, "validate", "-pk", f"file://{public}", token).strip() == "{sub=svc}"


def test_default_key_pair_is_rs256_and_headers(tmp_path, capsys):
    private, public = tmp_path / "a.key", tmp_path / "a.pub"
    ok(capsys, "create-key-pair", "--output-private-key", str(private), "--output-public-key", str(public))
    token = ok(
        capsys, "create", "-s", "x", "-pk", str(private), "-hs", "kid=key-1", "--headers", "env=test"
    ).strip()
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "RS256" and header["kid"] == "key-1" and header["env"] == "test"


def test_show_prints_header_and_payload(tmp_path, capsys, monkeypatch):
    key = tmp_path / "s.key"
    key.write_bytes(b"k" * 32)
    token = ok(capsys, "create", "-s", "alice", "-sk", str(key)).strip()
    out = ok(capsys, "show", token)
    header, sep, payload = out.strip().split("\n")
    assert json.loads(header)["alg"] == "HS256" and sep == "---" and json.loads(payload) == {"sub": "alice"}
    path = tmp_path / "alice.token"
    path.write_text(token + "\n")
    assert ok(capsys, "show", "-f", str(path)) == out
    monkeypatch.setenv("TOKEN", token)
    assert ok(capsys, "show") == out
    monkeypatch.delenv("TOKEN")
    assert "--stdin or --token-file" in error(capsys, "show")
    assert "not a JWT" in error(capsys, "show", "not-a-token")


def test_validate_refuses_bad_tokens_without_printing_them(tmp_path, capsys):
    key, other = tmp_path / "s.key", tmp_path / "other.key"
    key.write_bytes(b"s" * 32)
    other.write_bytes(b"o" * 32)
    good = ok(capsys, "create", "-s", "bob", "-sk", str(key), "-e", "1h").strip()
    claims = ok(capsys, "validate", "-sk", f"file://{key}", good).strip()
    assert claims.startswith("{sub=bob, exp=") and claims.endswith("}")
    expired = jwt.encode({"sub": "bob", "exp": int(time.time()) - 60}, b"s" * 32, algorithm="HS256")
    for token, words in ((expired, "expired"), (good, "signature"), ("a.b.c", "malformed")):
        secret = key if token is expired else other
        line = error(capsys, "validate", "-sk", str(secret), token)
        assert words in line and token not in line
    assert "either --secret-key or --public-key" in error(capsys, "validate", good)
    assert "only one of" in error(capsys, "validate", "-sk", str(key), "-pk", str(key), good)


def test_create_mistakes_are_one_line(tmp_path, capsys):
    key = tmp_path / "s.key"
    key.write_bytes(b"s" * 32)
    assert "either --secret-key or --private-key" in error(capsys, "create", "-s", "x")
    assert "invalid time" in error(capsys, "create", "-s", "x", "-sk", str(key), "-e", "soon")
    assert "not RS256" in error(capsys, "create", "-s", "x", "-sk", str(key), "-a", "RS256")
    assert "--headers" in error(capsys, "create", "-s", "x", "-sk", str(key), "-hs", "novalue")
    line = error(capsys, "create", "-s", "x", "-sk", f"file://{tmp_path}/missing.key")
    assert "missing.key" in line
    line = error(capsys, "create", "-s", "x", "-pk", str(key))  # a secret is not a private key
    assert "private key" in line


def test_expired_token_refused_by_the_broker_too(tmp_path, capsys):
    key = tmp_path / "s.key"
    ok(capsys, "create-secret-key", "-o", str(key))
    token = jwt.encode({"sub": "late", "exp": int(time.time()) - 5}, key.read_bytes(), algorithm="HS256")
    with pytest.raises(AuthenticationFailed, match="expired"):
        broker_role(token, tokenSecretKey=f"file://{key}")
    assert Path(key).exists()


def test_overwritten_key_files_become_owner_only(capsys, tmp_path):
    """os.open's mode only applies to new files: an existing world-readable file that a key is
    written over must end up 0600 (the public key of a pair 0644) all the same."""
    secret = tmp_path / "secret.key"
    private, public = tmp_path / "my-private.key", tmp_path / "my-public.key"
    for path in (secret, private, public):
        path.write_bytes(b"old")
        path.chmod(0o666)
    ok(capsys, "create-secret-key", "--output", str(secret))
    ok(capsys, "create-key-pair", "--output-private-key", str(private), "--output-public-key", str(public))
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_bytes()) == 32
    assert private.stat().st_mode & 0o777 == 0o600 and private.read_bytes() != b"old"
    assert public.stat().st_mode & 0o777 == 0o644
