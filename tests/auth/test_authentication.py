"""AuthenticationService and its providers (token, basic, tls), built from real config keys,
key files and htpasswd files that tests/security/helpers generates."""

from __future__ import annotations

import base64
import time

import pytest
from security.helpers import (
    APR1,
    BCRYPT,
    CRYPT,
    data_url,
    ec_key_pair,
    file_url,
    htpasswd_base64,
    mint_token,
    rsa_key_pair,
    secret_key,
    write_htpasswd,
)

from compactmq.auth import AuthenticationService, Principal
from compactmq.config import PROVIDER_BASIC, PROVIDER_TLS, PROVIDER_TOKEN, load_config
from compactmq.errors import AuthenticationFailed, InvalidConfiguration


def service(providers=(PROVIDER_TOKEN,), environ=None, **keys) -> AuthenticationService:
    overrides = {"authenticationEnabled": "true", "authenticationProviders": ",".join(providers)}
    overrides.update({k: str(v) for k, v in keys.items()})
    return AuthenticationService.from_config(load_config(overrides=overrides), environ=environ or {})


def refused(svc, method, data, match, peer_cert=None):
    with pytest.raises(AuthenticationFailed, match=match) as info:
        svc.authenticate_connect(method, data, peer_cert)
    return str(info.value)


# --- token --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secret():
    return secret_key()


def test_hs256_secret_key_forms(tmp_path, secret):
    path = tmp_path / "secret.key"
    path.write_bytes(secret)
    token = mint_token("alice", secret, expires_in=3600)
    for spec in (file_url(path), data_url(secret), base64.b64encode(secret).decode(), str(path)):
        principal = service(tokenSecretKey=spec).authenticate_connect("token", token.encode(), None)
        assert principal.role == "alice" and principal.method == "token"
        assert principal.expires_at == pytest.approx(time.time() + 3600, abs=5)


def test_token_without_exp_never_expires(secret):
    svc = service(tokenSecretKey=data_url(secret))
    principal = svc.authenticate_connect("token", mint_token("bob", secret).encode(), None)
    assert principal == Principal("bob", "token", None)
    assert not svc.is_expired(principal, now=time.time() + 10 * 365 * 86400)


@pytest.mark.parametrize("make_pair, alg", [(rsa_key_pair, "RS256"), (ec_key_pair, "ES256")])
@pytest.mark.parametrize("pem", [False, True])
def test_public_key_tokens(tmp_path, make_pair, alg, pem):
    pair = make_pair()
    _, public = pair.write(tmp_path, pem=pem)
    svc = service(tokenPublicKey=file_url(public), tokenPublicAlg=alg)
    assert svc.authenticate_connect("token", mint_token("carol", pair).encode(), None).role == "carol"
    other = make_pair()
    refused(svc, "token", mint_token("carol", other).encode(), "signature does not verify")
    # a secret-key token is never accepted by a public-key broker
    refused(svc, "token", mint_token("carol", secret_key()).encode(), f"signed with HS256.*accepts {alg}")


def test_token_failures_say_why_and_never_echo_the_token(secret):
    svc = service(tokenSecretKey=data_url(secret))
    expired = mint_token("alice", secret, expires_in=-120)
    message = refused(svc, "token", expired.encode(), r"token expired at \d{4}-\d\d-\d\dT")
    assert expired not in message and expired.split(".")[1] not in message
    wrong = mint_token("alice", secret_key())
    assert wrong not in refused(svc, "token", wrong.encode(), "signature does not verify")
    refused(svc, "token", b"not-a-jwt", "malformed token")
    refused(svc, "token", b"", "no token given")
    refused(svc, "token", b"\xff\xfe", "not ASCII")
    refused(svc, "token", mint_token(None, secret, claims={"name": "x"}).encode(), "no 'sub' claim")
    early = mint_token("a", secret, claims={"nbf": int(time.time()) + 600})
    refused(svc, "token", early.encode(), "not valid yet")


def test_clock_skew_applies_to_expiry_and_refresh(secret):
    svc = service(tokenSecretKey=data_url(secret), tokenAllowedClockSkewSeconds=60)
    recent = mint_token("alice", secret, expires_in=-30)  # expired 30 s ago, within the 60 s skew
    principal = svc.authenticate_connect("token", recent.encode(), None)
    assert not svc.is_expired(principal, now=principal.expires_at + 30)
    assert svc.is_expired(principal, now=principal.expires_at + 61)
    refused(svc, "token", mint_token("alice", secret, expires_in=-90).encode(), "token expired")


def test_custom_role_claim_and_audience(secret):
    svc = service(
        tokenSecretKey=data_url(secret),
        tokenAuthClaim="role",
        tokenAudienceClaim="aud",
        tokenAudience="broker-a",
    )
    good = mint_token(None, secret, claims={"role": "svc-1", "aud": "broker-a"})
    assert svc.authenticate_connect("token", good.encode(), None).role == "svc-1"
    in_list = mint_token(None, secret, claims={"role": "svc-1", "aud": ["x", "broker-a"]})
    assert svc.authenticate_connect("token", in_list.encode(), None).role == "svc-1"
    for claims in ({"role": "svc-1", "aud": "broker-b"}, {"role": "svc-1"}, {"role": "svc-1", "aud": ["x"]}):
        refused(svc, "token", mint_token(None, secret, claims=claims).encode(), "audience")
    # without tokenAudienceClaim an aud claim is not checked (PyJWT would refuse it by default)
    plain = service(tokenSecretKey=data_url(secret))
    assert plain.authenticate_connect("token", mint_token("a", secret, claims={"aud": "zzz"}).encode(), None)


@pytest.mark.parametrize(
    "keys, message",
    [
        ({}, "needs tokenSecretKey .* or tokenPublicKey"),
        ({"tokenSecretKey": "file:///no/such.key"}, "tokenSecretKey: cannot read"),
        ({"tokenSecretKey": "data:;base64,AAAA", "tokenAudienceClaim": "aud"}, "tokenAudience is empty"),
        ({"tokenPublicKey": "data:;base64,AAAA"}, "tokenPublicKey: not a DER or PEM public key"),
        ({"tokenPublicKey": "PUB", "tokenPublicAlg": "HS256"}, "tokenPublicAlg='HS256'"),
        ({"tokenPublicKey": "PUB", "tokenPublicAlg": "ES256"}, "does not match tokenPublicKey"),
    ],
)
def test_token_configuration_errors(keys, message):
    keys = {k: (data_url(rsa_key_pair().public_der) if v == "PUB" else v) for k, v in keys.items()}
    with pytest.raises(InvalidConfiguration, match=message):
        service(**keys)


# --- basic --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def htpasswd(tmp_path_factory):
    return write_htpasswd(
        tmp_path_factory.mktemp("basic") / ".htpasswd",
        {"bc": ("pw-bcrypt", BCRYPT), "md5": ("pw-apr1", APR1), "des": ("pw-des", CRYPT)},
    )


def basic(user, password) -> bytes:
    return f"{user}:{password}".encode()


def test_basic_schemes_and_sources(htpasswd, tmp_path, monkeypatch):
    monkeypatch.chdir(htpasswd.parent)
    sources = [
        {"basicAuthConf": str(htpasswd)},
        {"basicAuthConf": htpasswd.name},  # relative to the current directory
        {"basicAuthConf": file_url(htpasswd)},
        {"basicAuthConf": htpasswd_base64(htpasswd)},
    ]
    for keys in sources:
        svc = service((PROVIDER_BASIC,), **keys)
        for user, password in (("bc", "pw-bcrypt"), ("md5", "pw-apr1"), ("des", "pw-des")):
            principal = svc.authenticate_connect("basic", basic(user, password), None)
            assert principal == Principal(user, "basic", None)
    env = {"PULSAR_EXTRA_OPTS": f"-Xmx1g -Dpulsar.auth.basic.conf={htpasswd} -Dother=1"}
    svc = service((PROVIDER_BASIC,), environ=env)
    assert svc.authenticate_connect("basic", basic("md5", "pw-apr1"), None).role == "md5"


def test_basic_failures(htpasswd):
    svc = service((PROVIDER_BASIC,), basicAuthConf=str(htpasswd))
    for user, password in (("bc", "nope-1"), ("md5", "pw-bcrypt"), ("des", "pw-de"), ("nobody", "x")):
        message = refused(svc, "basic", basic(user, password), "unknown user or wrong password")
        assert password not in message
    refused(svc, "basic", b"no-colon", "must be user:password")
    # a success is remembered, but only for exactly that password
    assert svc.authenticate_connect("basic", basic("bc", "pw-bcrypt"), None).role == "bc"
    refused(svc, "basic", basic("bc", "pw-bcrypt "), "wrong password")


@pytest.mark.parametrize(
    "content, message",
    [
        ("alice\n", "line 1: expected user:hash"),
        ("# users\nalice:{SHA}abc\n", "line 2: the hash of user 'alice' is not bcrypt"),
        ("\n# nobody\n", "no users"),
    ],
)
def test_basic_bad_files(tmp_path, content, message):
    path = tmp_path / "bad.htpasswd"
    path.write_text(content)
    with pytest.raises(InvalidConfiguration, match=message):
        service((PROVIDER_BASIC,), basicAuthConf=str(path))


def test_basic_needs_a_file():
    with pytest.raises(InvalidConfiguration, match="needs basicAuthConf"):
        service((PROVIDER_BASIC,), environ={"PULSAR_EXTRA_OPTS": "-Xmx1g"})


# --- tls and choosing a provider ------------------------------------------------------------------

CERT_ALICE = {"subject": ((("countryName", "US"),), (("commonName", "alice"),)), "notAfter": "x"}


def test_tls_role_is_the_cn():
    svc = service((PROVIDER_TLS,))
    assert svc.authenticate_connect("tls", b"", CERT_ALICE) == Principal("alice", "tls", None)
    # a client with a certificate that sends no method still authenticates by its certificate
    assert svc.authenticate_connect("none", b"", CERT_ALICE).role == "alice"
    refused(svc, "tls", b"", "needs a client certificate", peer_cert=None)
    refused(svc, "tls", b"", "needs a client certificate", peer_cert={})  # unverified: getpeercert() == {}
    refused(svc, "tls", b"", "no common name", peer_cert={"subject": ((("organizationName", "x"),),)})


def test_tls_role_from_a_real_handshake(tmp_path):
    from security.helpers import make_pki
    from security.test_helpers import _client_ctx, _handshake, _server_ctx

    pki = make_pki(tmp_path)
    peer = _handshake(_server_ctx(pki, pki.server), _client_ctx(pki, pki.client("billing-service")))
    assert service((PROVIDER_TLS,)).authenticate_connect("tls", b"", peer).role == "billing-service"


def test_several_providers_and_http(secret, htpasswd):
    svc = service(
        (PROVIDER_TOKEN, PROVIDER_TLS, PROVIDER_BASIC),
        tokenSecretKey=data_url(secret),
        basicAuthConf=str(htpasswd),
    )
    assert svc.methods == ("token", "tls", "basic")
    token = mint_token("alice", secret)
    assert svc.authenticate_http(f"Bearer {token}", None).role == "alice"
    assert svc.authenticate_http(f"bearer   {token} ", None).role == "alice"
    header = "Basic " + base64.b64encode(b"md5:pw-apr1").decode()
    assert svc.authenticate_http(header, None) == Principal("md5", "basic", None)
    assert svc.authenticate_http(None, CERT_ALICE) == Principal("alice", "tls", None)
    # an explicit credential wins over the certificate
    assert svc.authenticate_http(f"Bearer {token}", {"subject": ((("commonName", "x"),),)}).role == "alice"
    accepts = "this broker accepts: token, tls, basic"
    with pytest.raises(AuthenticationFailed, match="authentication required; " + accepts):
        svc.authenticate_http(None, None)
    with pytest.raises(AuthenticationFailed, match="unsupported Authorization scheme 'digest'"):
        svc.authenticate_http("Digest abc", None)
    with pytest.raises(AuthenticationFailed, match="not valid base64"):
        svc.authenticate_http("Basic ***", None)
    refused(svc, "oauth2", b"x", "method 'oauth2' is not enabled on this broker; it accepts: token, tls")
    with pytest.raises(AuthenticationFailed, match="signature"):
        svc.authenticate_http(f"Bearer {mint_token('alice', secret_key())}", None)


def test_anonymous_role_and_disabled_service(secret):
    svc = service(tokenSecretKey=data_url(secret), anonymousUserRole="guest")
    assert svc.authenticate_connect("", b"", None) == Principal("guest", "anonymous", None)
    assert svc.authenticate_http(None, None) == Principal("guest", "anonymous", None)
    # bad credentials are refused, not downgraded to the anonymous role
    refused(svc, "token", b"garbage", "malformed")
    # a method no provider has falls back to the anonymous role (Pulsar's ServerCnx.handleConnect)
    assert svc.authenticate_connect("unknown", b"admin:123456", None) == Principal("guest", "anonymous", None)
    off = AuthenticationService.from_config(load_config())
    assert not off.enabled
    assert off.authenticate_connect("token", b"garbage", None) == Principal(None, "none", None)
    assert off.authenticate_http("Bearer garbage", None) == Principal(None, "none", None)


def test_refresh_keeps_the_role(secret):
    svc = service(tokenSecretKey=data_url(secret))
    first = svc.authenticate_connect("token", mint_token("alice", secret, expires_in=1).encode(), None)
    fresh = svc.refresh(first, "token", mint_token("alice", secret, expires_in=3600).encode(), None)
    assert fresh.role == "alice" and fresh.expires_at > first.expires_at
    with pytest.raises(AuthenticationFailed, match="role cannot change"):
        svc.refresh(first, "token", mint_token("mallory", secret).encode(), None)


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"authenticationProviders": "com.example.MyProvider"}, "unknown provider 'com.example.MyProvider'"),
        ({"authenticationProviders": ""}, "needs authenticationProviders"),
    ],
)
def test_provider_configuration_errors(keys, message):
    overrides = {"authenticationEnabled": "true", **keys}
    with pytest.raises(InvalidConfiguration, match=message):
        AuthenticationService.from_config(load_config(overrides=overrides))


def test_nothing_secret_in_reprs(secret, htpasswd):
    keys = {"tokenSecretKey": data_url(secret), "basicAuthConf": str(htpasswd)}
    svc = service((PROVIDER_TOKEN, PROVIDER_BASIC), **keys)
    text = repr(svc.providers)
    assert secret.hex() not in text and "$2y$" not in text and "apr1" not in text


def test_an_unknown_user_costs_one_hash_check_like_a_wrong_password(tmp_path, monkeypatch):
    """Counted, not timed: every refusal checks exactly one hash of the file's usual kind and
    cost, so the answer's timing does not say whether the user exists."""
    import bcrypt

    from compactmq.auth import basic as basic_module

    path = write_htpasswd(
        tmp_path / ".htpasswd",
        {"ann": ("pw-a", BCRYPT), "ben": ("pw-b", BCRYPT), "old": ("pw-o", APR1)},
    )
    svc = service((PROVIDER_BASIC,), basicAuthConf=str(path))
    checked: list[bytes] = []
    real_checkpw = bcrypt.checkpw

    def counting_checkpw(password: bytes, hashed: bytes) -> bool:
        checked.append(hashed)
        return real_checkpw(password, hashed)

    monkeypatch.setattr(basic_module.bcrypt, "checkpw", counting_checkpw)
    refused(svc, "basic", basic("ann", "wrong"), "unknown user or wrong password")
    assert len(checked) == 1
    known_cost = checked[0][:7]  # $2b$04$: scheme and cost
    checked.clear()
    for unknown in ("nobody", "ann2", "x" * 300):
        refused(svc, "basic", basic(unknown, "wrong"), "unknown user or wrong password")
        assert len(checked) == 1 and checked[0][:7] == known_cost, (unknown, checked)
        checked.clear()
    # the stand-in check never lets anyone in, whatever password matches it
    for password in ("pw-a", "pw-b"):
        refused(svc, "basic", basic("nobody", password), "unknown user or wrong password")
