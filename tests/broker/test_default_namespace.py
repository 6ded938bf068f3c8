"""When the standalone creates public/default: as Pulsar's own admin client would be allowed to."""

from __future__ import annotations

from security.helpers import data_url, make_pki, mint_token, secret_key, write_htpasswd  # tests/ on sys.path

from compactmq.auth import AuthenticationService
from compactmq.broker.default_namespace import ensure_default_namespace, may_create
from compactmq.config import load_config
from compactmq.storage.metadata_store import create_metadata_store
from compactmq.storage.resources import PulsarResources

TOKEN, BASIC, TLS = (
    f"org.apache.pulsar.broker.authentication.AuthenticationProvider{p}" for p in ("Token", "Basic", "Tls")
)
CLIENT = "org.apache.pulsar.client.impl.auth."
SECRET = secret_key()


def decide(tmp_path, **overrides):
    config = load_config(overrides={"tokenSecretKey": data_url(SECRET), **overrides})
    return may_create(config, AuthenticationService.from_config(config))


def secured(**more):
    return {
        "authenticationEnabled": "true",
        "authenticationProviders": ",".join((TOKEN, TLS, BASIC) if "basicAuthConf" in more else (TOKEN, TLS)),
        "authorizationEnabled": "true",
        "superUserRoles": "admin,superUser",
        **more,
    }


def test_without_security_the_broker_creates_it(tmp_path):
    assert decide(tmp_path) == (True, "")


def test_anonymous_without_authorization_may_create_it(tmp_path):
    assert decide(tmp_path, authenticationEnabled="true", anonymousUserRole="anonymous")[0]


def test_no_credentials_or_a_role_that_is_not_a_superuser_may_not(tmp_path):
    allowed, why = decide(tmp_path, **secured())
    assert not allowed and "not authenticated" in why
    allowed, why = decide(tmp_path, **secured(anonymousUserRole="anonymous"))
    assert not allowed and "'anonymous'" in why and "not a superuser" in why
    token = mint_token("someone", SECRET)
    allowed, why = decide(
        tmp_path,
        **secured(
            brokerClientAuthenticationPlugin=CLIENT + "AuthenticationToken",
            brokerClientAuthenticationParameters=f"token:{token}",
        ),
    )
    assert not allowed and "'someone'" in why
    bad = decide(
        tmp_path,
        **secured(
            brokerClientAuthenticationPlugin=CLIENT + "AuthenticationToken",
            brokerClientAuthenticationParameters="token:not-a-jwt",
        ),
    )
    assert not bad[0] and "not authenticated" in bad[1]


def test_the_broker_client_credentials_of_a_superuser(tmp_path):
    token = mint_token("superUser", SECRET)
    (tmp_path / "token.txt").write_text(token + "\n")
    for params in (f"token:{token}", token, f'{{"token": "{token}"}}', f"file://{tmp_path}/token.txt"):
        assert decide(
            tmp_path,
            **secured(
                brokerClientAuthenticationPlugin=CLIENT + "AuthenticationToken",
                brokerClientAuthenticationParameters=params,
            ),
        ) == (True, ""), params
    htpasswd = write_htpasswd(tmp_path / "htpasswd", {"admin": "pw"})
    assert decide(
        tmp_path,
        **secured(
            basicAuthConf=str(htpasswd),
            brokerClientAuthenticationPlugin=CLIENT + "AuthenticationBasic",
            brokerClientAuthenticationParameters='{"userId": "admin", "password": "pw"}',
        ),
    )[0]
    cert = make_pki(tmp_path / "pki").client("admin")
    assert decide(
        tmp_path,
        **secured(
            brokerClientAuthenticationPlugin=CLIENT + "AuthenticationTls",
            brokerClientAuthenticationParameters=f"tlsCertFile:{cert.cert},tlsKeyFile:{cert.key}",
        ),
    )[0]
    allowed, why = decide(tmp_path, **secured(brokerClientAuthenticationPlugin="com.example.Custom"))
    assert not allowed and "com.example.Custom" in why


def test_created_with_pulsars_tenant_info_and_again_after_a_delete(tmp_path):
    kv = create_metadata_store("", data_dir=tmp_path)
    res = PulsarResources(kv)
    try:
        assert not res.namespaces.exists("public/default") and res.tenants.get("public") is None
        refused = load_config(overrides=secured(tokenSecretKey=data_url(SECRET)))
        assert not ensure_default_namespace(res, refused, AuthenticationService.from_config(refused))
        assert res.tenants.get("public") is None  # nothing is created when the client is refused
        plain = load_config(overrides={"superUserRoles": "admin"})
        assert ensure_default_namespace(res, plain, AuthenticationService.from_config(plain))
        assert res.tenants.get("public") == {"adminRoles": ["admin"], "allowedClusters": ["standalone"]}
        res.namespaces.delete("public/default")
        assert ensure_default_namespace(res, plain, AuthenticationService.from_config(plain))
        assert res.namespaces.exists("public/default")
    finally:
        kv.close()
