"""The admin REST API of a broker with authentication and authorization on (one broker for the
module: token HS256, basic and TLS providers, ``admin`` the superuser, the HTTPS web port).

* 401 with ``{"reason"}`` and ``WWW-Authenticate`` without credentials, and with a malformed,
  expired or wrongly signed token, a wrong password, an unknown user; the secret is never echoed;
* 403 for a role that lacks the right: tenants and clusters are superuser business, namespace and
  topic administration (compaction trigger and status, policies, grants) the tenant's admin role;
* the superuser creates tenants (``adminRoles``, ``allowedClusters`` -- unknown clusters 412),
  namespaces (with ``auth_policies.namespace_auth``) and grants; a tenant admin runs its own
  namespaces, including a compaction over REST, and nobody else's;
* the permission paths: bodies, 400 for an unknown action, 412 revoking a topic grant that is not
  there, topic grants merged with the namespace's;
* ``GET .../partitions`` (the HTTP half of a lookup) needs produce or consume, like a lookup;
* ``/metrics`` needs credentials (``authenticateMetricsEndpoint`` unset follows
  ``authenticationEnabled``; explicit false is tested in ``test_metrics_auth``);
* TLS client certificates over https: the CN is the role; no certificate 401; an untrusted one
  fails the handshake;
* RS256 tokens on a second broker, with an audience.

The module's broker compacts with the test suite's Arrow factory (``broker.factories``): who may
compact is decided by the admin API before any factory is asked; Spark's runs are the subject of
their own modules.
"""

from __future__ import annotations

import ssl
import urllib.error

import pytest

pytest.importorskip("pulsar")

from admin.harness import start_broker  # noqa: E402
from broker.conftest import make_client  # noqa: E402
from broker.factories import ARROW_FACTORY  # noqa: E402
from harness.wait import wait_until  # noqa: E402

from .adminhttp import SUPERUSER, HttpAs, start_secured_broker  # noqa: E402
from .helpers import file_url, mint_token, rsa_key_pair  # noqa: E402

pytestmark = pytest.mark.integration

NS = "/admin/v2/namespaces"
TENANTS = "/admin/v2/tenants"


@pytest.fixture(scope="module")
def sb(tmp_path_factory, pki):
    secured = start_secured_broker(
        tmp_path_factory.mktemp("admin-auth"), pki, compactionServiceFactoryClassName=ARROW_FACTORY
    )
    admin = secured.as_token(SUPERUSER)
    admin.ok(
        "PUT", f"{TENANTS}/acme", {"adminRoles": ["acme-admin", "ops"], "allowedClusters": ["standalone"]}
    )
    admin.ok("PUT", f"{NS}/acme/orders")
    yield secured
    secured.broker.stop()


# --- authentication -------------------------------------------------------------------------------


def test_missing_and_bad_credentials_are_401(sb):
    wrong_key = mint_token(SUPERUSER, b"another-secret-of-32-bytes-long!")
    for label, client in [
        ("no credentials", sb.anonymous()),
        ("malformed token", HttpAs(sb.http_url, {"Authorization": "Bearer not.a-jwt"})),
        ("expired token", sb.as_token(SUPERUSER, expires_in=-60)),
        ("wrongly signed token", HttpAs(sb.http_url, {"Authorization": f"Bearer {wrong_key}"})),
        ("wrong password", sb.as_basic("ops", "guess")),
        ("unknown user", HttpAs(sb.http_url, {"Authorization": "Basic bm9ib2R5Om5vdGhpbmc="})),
        ("unknown scheme", HttpAs(sb.http_url, {"Authorization": "Negotiate abc"})),
    ]:
        status, body, headers = client.call("GET", TENANTS)
        assert status == 401, (label, status, body)
        assert isinstance(body, dict) and body["reason"], (label, body)
        assert headers.get("WWW-Authenticate"), label
        sent = client.headers.get("Authorization", "").split(" ", 1)[-1]
        assert not sent or sent not in body["reason"], (label, body)  # the credential is never echoed
        assert "guess" not in body["reason"]
    # unknown paths and the OpenAPI document need credentials too; errors stay JSON
    assert sb.anonymous().call("GET", "/admin/v2/no/such/path")[0] == 401
    assert sb.anonymous().call("GET", "/admin/v2/openapi.json")[0] == 401
    assert sb.broker.alive()


def test_metrics_need_credentials_when_authentication_is_on(sb):
    status, body, headers = sb.anonymous().call("GET", "/metrics")
    assert status == 401 and body["reason"] and headers.get("WWW-Authenticate")
    status, text, _ = sb.as_token(SUPERUSER).call("GET", "/metrics")
    assert status == 200 and "pulsar_" in text


def test_right_credentials_of_each_kind(sb):
    assert "acme" in sb.as_token(SUPERUSER).ok("GET", TENANTS)
    assert "acme" in sb.as_token(SUPERUSER, expires_in=600).ok("GET", TENANTS)
    assert sb.as_basic("ops").ok("GET", f"{NS}/acme") == ["acme/orders"]  # ops: basic user, acme admin
    assert "acme" in sb.as_cert(SUPERUSER).ok("GET", TENANTS)  # TLS client certificate, CN=admin


# --- authorization: superuser business ------------------------------------------------------------


def test_tenants_and_clusters_need_a_superuser(sb):
    tenant_admin = sb.as_token("acme-admin")
    for method, path, body in [
        ("GET", TENANTS, None),
        ("PUT", f"{TENANTS}/rogue", {"adminRoles": ["acme-admin"]}),
        ("POST", f"{TENANTS}/acme", {"adminRoles": ["acme-admin", "me-too"]}),
        ("DELETE", f"{TENANTS}/acme", None),
        ("GET", f"{TENANTS}/acme", None),
        ("GET", "/admin/v2/clusters", None),
    ]:
        tenant_admin.error(method, path, 403, body)
    admin = sb.as_token(SUPERUSER)
    want = {"adminRoles": ["acme-admin", "ops"], "allowedClusters": ["standalone"]}
    assert admin.ok("GET", f"{TENANTS}/acme") == want
    assert admin.ok("GET", "/admin/v2/clusters") == ["standalone"]


def test_tenant_info_validation(sb):
    admin = sb.as_token(SUPERUSER)
    assert "do not exist" in admin.error("PUT", f"{TENANTS}/faraway", 412, {"allowedClusters": ["mars"]})
    admin.error("PUT", f"{TENANTS}/faraway", 400, {"adminRoles": "just-me"})
    admin.error("GET", f"{TENANTS}/faraway", 404)
    admin.ok("PUT", f"{TENANTS}/nearby", {"adminRoles": ["n1"]})  # clusters default to this cluster
    assert admin.ok("GET", f"{TENANTS}/nearby") == {"adminRoles": ["n1"], "allowedClusters": ["standalone"]}
    admin.ok("POST", f"{TENANTS}/nearby", {"adminRoles": ["n1", "n2"], "allowedClusters": ["standalone"]})
    assert admin.ok("GET", f"{TENANTS}/nearby")["adminRoles"] == ["n1", "n2"]
    sb.as_token("n2").ok("PUT", f"{NS}/nearby/ns")  # the new admin role counts at once
    admin.ok("DELETE", f"{NS}/nearby/ns")
    admin.ok("DELETE", f"{TENANTS}/nearby")


# --- authorization: tenant administration ---------------------------------------------------------


def test_tenant_admin_runs_its_namespaces_and_nobody_elses(sb):
    acme = sb.as_token("acme-admin")
    acme.ok("PUT", f"{NS}/acme/billing")
    acme.ok("POST", f"{NS}/acme/billing/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 10})
    acme.ok("PUT", f"{NS}/acme/billing/compactionThreshold", 1024)
    assert acme.ok("GET", f"{NS}/acme/billing/compactionThreshold") == 1024
    acme.ok("PUT", "/admin/v2/persistent/acme/billing/invoices")
    assert acme.ok("GET", "/admin/v2/persistent/acme/billing") == ["persistent://acme/billing/invoices"]
    assert acme.ok("GET", "/admin/v2/persistent/acme/billing/invoices/compaction")["status"] == "NOT_RUN"
    # not its tenant: public belongs to the superuser alone
    acme.error("PUT", f"{NS}/public/acme-was-here", 403)
    acme.error(
        "POST", f"{NS}/public/default/retention", 403, {"retentionTimeInMinutes": 1, "retentionSizeInMB": 1}
    )
    acme.error("PUT", "/admin/v2/persistent/public/default/t/compaction", 403)
    acme.error("GET", f"{NS}/public/default/permissions", 403)
    acme.ok("DELETE", "/admin/v2/persistent/acme/billing/invoices")
    acme.ok("DELETE", f"{NS}/acme/billing")


def test_non_admin_cannot_compact_or_change_policies(sb):
    admin = sb.as_token(SUPERUSER)
    admin.ok("POST", f"{NS}/acme/orders/permissions/worker", ["produce", "consume"])
    worker = sb.as_token("worker")  # may produce and consume, administers nothing
    topic = "/admin/v2/persistent/acme/orders/jobs"
    admin.ok("PUT", topic)
    for method, path, body in [
        ("PUT", f"{topic}/compaction", None),
        ("GET", f"{topic}/compaction", None),
        ("POST", f"{topic}/compactionThreshold", 1),
        ("PUT", f"{NS}/acme/orders/compactionThreshold", 1),
        ("POST", f"{NS}/acme/orders/retention", {"retentionTimeInMinutes": 1, "retentionSizeInMB": 1}),
        ("POST", f"{NS}/acme/orders/permissions/worker", ["produce", "consume", "functions"]),
        ("DELETE", topic, None),
        ("PUT", f"{NS}/acme/more", None),
    ]:
        worker.error(method, path, 403, body)
    assert worker.ok("GET", "/admin/v2/persistent/acme/orders")  # a namespace grant may list its topics
    sb.as_token("stranger").error("GET", "/admin/v2/persistent/acme/orders", 403)
    # stats are Pulsar's GET_STATS topic operation: whoever may look the topic up reads them
    assert "msgInCounter" in worker.ok("GET", f"{topic}/stats")
    assert "ledgers" in worker.ok("GET", f"{topic}/internalStats")
    for path in (f"{topic}/stats", f"{topic}/internalStats"):
        sb.as_token("stranger").error("GET", path, 403)
    assert sb.as_basic("alice").error("PUT", f"{topic}/compaction", 403)  # basic user without rights
    assert sb.as_cert("someone").error("PUT", f"{topic}/compaction", 403)  # certificate without rights
    assert admin.ok("GET", f"{topic}/compactionThreshold") is None  # nothing changed


def test_partitioned_metadata_needs_lookup_rights(sb):
    admin = sb.as_token(SUPERUSER)
    admin.ok("PUT", f"{NS}/acme/lookups")
    admin.ok("PUT", "/admin/v2/persistent/acme/lookups/p/partitions", 2)
    path = "/admin/v2/persistent/acme/lookups/p/partitions"
    sb.as_token("stranger").error("GET", path, 403)
    admin.ok("POST", "/admin/v2/persistent/acme/lookups/p/permissions/reader", ["consume"])
    assert sb.as_token("reader").ok("GET", path)["partitions"] == 2
    assert sb.as_token("acme-admin").ok("GET", path)["partitions"] == 2


# --- permission paths -----------------------------------------------------------------------------


def test_namespace_creation_body_and_permission_paths(sb):
    admin = sb.as_token(SUPERUSER)
    admin.ok(
        "PUT",
        f"{NS}/acme/events",
        {
            "auth_policies": {"namespace_auth": {"reader": ["consume"]}},
            "replication_clusters": ["standalone"],
        },
    )
    base = f"{NS}/acme/events/permissions"
    assert admin.ok("GET", base) == {"reader": ["consume"]}
    acme = sb.as_token("acme-admin")  # a tenant admin manages grants of its namespaces
    acme.ok("POST", f"{base}/writer", ["produce"])
    acme.ok("POST", f"{base}/reader", ["consume", "produce"])  # replaces the role's grant
    assert acme.ok("GET", base) == {"reader": ["consume", "produce"], "writer": ["produce"]}
    assert "unknown action" in acme.error("POST", f"{base}/writer", 400, ["produce", "delete-everything"])
    acme.error("POST", f"{base}/writer", 400, {"actions": ["produce"]})
    acme.ok("DELETE", f"{base}/writer")
    assert acme.ok("GET", base) == {"reader": ["consume", "produce"]}
    admin.error("GET", f"{NS}/acme/nowhere/permissions", 404)
    admin.error("PUT", f"{NS}/acme/badbody", 400, {"auth_policies": {"namespace_auth": {"x": ["teleport"]}}})
    admin.error("GET", f"{NS}/acme/badbody", 404)  # a refused body creates nothing

    topic = "/admin/v2/persistent/acme/events/clicks"
    acme.ok("POST", f"{topic}/permissions/analyst", ["consume"])
    merged = acme.ok("GET", f"{topic}/permissions")
    assert merged["analyst"] == ["consume"] and merged["reader"] == ["consume", "produce"]
    assert "analyst" not in acme.ok("GET", base)  # a topic grant stays on its topic
    assert "not set at the topic level" in acme.error("DELETE", f"{topic}/permissions/reader", 412)
    acme.ok("DELETE", f"{topic}/permissions/analyst")
    assert "analyst" not in acme.ok("GET", f"{topic}/permissions")


# --- compaction over REST with credentials --------------------------------------------------------


def test_tenant_admin_compacts_over_rest(sb):
    import pulsar

    admin = sb.as_token(SUPERUSER)
    admin.ok("POST", f"{NS}/acme/orders/permissions/producer", ["produce"])
    topic = "persistent://acme/orders/compact-me"
    client = make_client(sb.broker.url, authentication=pulsar.AuthenticationToken(sb.token("producer")))
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(20):
            producer.send(f"v{i}".encode(), partition_key=f"k{i % 4}")
        producer.close()
    finally:
        client.close()
    acme = sb.as_token("acme-admin")
    path = "/admin/v2/persistent/acme/orders/compact-me/compaction"
    acme.ok("PUT", path)
    status = wait_until(
        lambda: (s := acme.ok("GET", path))["status"] != "RUNNING" and s, 120, "the compaction to end"
    )
    assert status["status"] == "SUCCESS", status
    stats = acme.ok("GET", "/admin/v2/persistent/acme/orders/compact-me/internalStats")
    assert stats  # the tenant admin reads its topic's internals too


def test_latest_value_needs_consume(sb):
    """``GET .../latest/{key}`` answers a message: it needs what consuming needs."""
    import pulsar

    admin = sb.as_token(SUPERUSER)
    admin.ok("POST", f"{NS}/acme/orders/permissions/writer-only", ["produce"])
    topic = "persistent://acme/orders/latest-auth"
    admin.ok("POST", "/admin/v2/persistent/acme/orders/latest-auth/permissions/watcher", ["consume"])
    client = make_client(sb.broker.url, authentication=pulsar.AuthenticationToken(sb.token("writer-only")))
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"secret-value", partition_key="k")
        producer.close()
    finally:
        client.close()
    path = "/admin/v2/persistent/acme/orders/latest-auth/latest/k"
    assert sb.anonymous().call("GET", path)[0] == 401
    for role in ("writer-only", "stranger"):
        assert "consume" in sb.as_token(role).error("GET", path, 403)
        sb.as_token(role).error("POST", path.rsplit("/", 1)[0], 403, ["k"])
    assert sb.as_token("watcher").ok("GET", path)["value"] == "c2VjcmV0LXZhbHVl"  # base64 of the value
    status, body, _ = sb.as_token("acme-admin").call("POST", path.rsplit("/", 1)[0], ["k"])
    assert status == 200 and body[0]["found"], body


# --- TLS client certificates ----------------------------------------------------------------------


def test_tls_client_certificates(sb):
    sb.as_cert(None).error("GET", TENANTS, 401)  # https without a certificate or a header
    assert sb.as_cert("acme-admin").ok("GET", f"{NS}/acme")  # CN = role = tenant admin
    sb.as_cert("acme-admin").error("GET", TENANTS, 403)
    # a header still works over https
    token = HttpAs(
        sb.https_url,
        {"Authorization": f"Bearer {sb.token(SUPERUSER)}"},
        ssl.create_default_context(cafile=str(sb.pki.ca.cert_path)),
    )
    assert "acme" in token.ok("GET", TENANTS)
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        sb.as_cert(SUPERUSER, trusted=False).call("GET", TENANTS)  # untrusted CA: no handshake
    assert sb.broker.alive()


# --- RS256 tokens with an audience ----------------------------------------------------------------


def test_rs256_tokens_with_audience(tmp_path, pki):
    keys = rsa_key_pair()
    private, public = keys.write(tmp_path)
    broker = start_broker(
        tmp_path / "data",
        authenticationEnabled="true",
        authorizationEnabled="true",
        authenticationProviders="org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
        superUserRoles=SUPERUSER,
        tokenPublicKey=file_url(public),
        tokenAudienceClaim="aud",
        tokenAudience="compactmq-admin",
        brokerClientAuthenticationPlugin="org.apache.pulsar.client.impl.auth.AuthenticationToken",
        brokerClientAuthenticationParameters="token:"
        + mint_token(SUPERUSER, keys, claims={"aud": "compactmq-admin"}),
    )
    try:
        url = f"http://127.0.0.1:{broker.web_port}"

        def as_token(token: str) -> HttpAs:
            return HttpAs(url, {"Authorization": f"Bearer {token}"})

        good = mint_token(SUPERUSER, keys, claims={"aud": "compactmq-admin"})
        assert "public" in as_token(good).ok("GET", TENANTS)
        as_token(mint_token(SUPERUSER, keys, claims={"aud": "someone-else"})).error("GET", TENANTS, 401)
        as_token(mint_token(SUPERUSER, keys)).error("GET", TENANTS, 401)  # no audience at all
        as_token(mint_token(SUPERUSER, rsa_key_pair(), claims={"aud": "compactmq-admin"})).error(
            "GET", TENANTS, 401
        )
        as_token(mint_token(SUPERUSER, b"x" * 32, claims={"aud": "compactmq-admin"})).error(
            "GET", TENANTS, 401
        )
        as_token(mint_token("user", keys, claims={"aud": "compactmq-admin"})).error("GET", TENANTS, 403)
    finally:
        broker.stop()
