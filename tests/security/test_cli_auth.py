"""The ``compactmq`` admin CLI against a broker with authentication and authorization on, with
pulsar-admin's global options: ``--auth-plugin``/``--auth-params`` for tokens (inline and
``file://``), basic and TLS client certificates over an ``https://`` admin URL with
``--tls-trust-cert-path``; tenants with admin roles, grants, and compaction over REST; a 401 or 403
is one line saying what to do next, and no secret is ever printed.

The commands run in this process (``harness.cli.run_cli``: ``main(argv)``, its streams and exit
status captured as a child's would be). The broker compacts with the test suite's Arrow factory
(``broker.factories.ARROW_FACTORY``): the subject here is who may trigger and watch a run, which
the admin API decides before any factory is asked; Spark's runs are the subject of their own
modules."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pulsar")

from broker.conftest import make_client
from broker.factories import ARROW_FACTORY
from harness.cli import CliResult, run_cli

from .adminhttp import PASSWORDS, SUPERUSER, start_secured_broker

pytestmark = pytest.mark.integration

TOKEN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
BASIC = "org.apache.pulsar.client.impl.auth.AuthenticationBasic"
TLS = "org.apache.pulsar.client.impl.auth.AuthenticationTls"


@pytest.fixture(scope="module")
def sb(tmp_path_factory, pki):
    secured = start_secured_broker(
        tmp_path_factory.mktemp("cli-auth"), pki, compactionServiceFactoryClassName=ARROW_FACTORY
    )
    yield secured
    secured.broker.stop()


def run(*args: str, url: str) -> CliResult:
    return run_cli("--admin-url", url, *args)


@pytest.fixture(scope="module")
def cli(sb):
    """``cli(*args, as_=...)``: as_ is ("token", role), ("token-file", role), ("basic", user),
    ("tls", cn) or None (no credentials)."""
    tmp = sb.pki.directory

    def call(
        *args: str, as_: tuple[str, str] | None = None, output: str | None = None, url: str | None = None
    ) -> CliResult:
        opts: list[str] = []
        if output:
            opts += ["--output", output]
        if as_ is not None:
            kind, who = as_
            if kind == "token":
                opts += ["--auth-plugin", TOKEN, "--auth-params", f"token:{sb.token(who)}"]
            elif kind == "token-file":
                path = tmp / f"{who}.token"
                path.write_text(sb.token(who))
                opts += ["--auth-plugin", "token", "--auth-params", f"file://{path}"]
            elif kind == "basic":
                opts += [
                    "--auth-plugin",
                    BASIC,
                    "--auth-params",
                    json.dumps({"userId": who, "password": PASSWORDS[who]}),
                ]
            elif kind == "tls":
                files = sb.pki.client(who)
                opts += [
                    "--auth-plugin",
                    TLS,
                    "--auth-params",
                    f"tlsCertFile:{files.cert},tlsKeyFile:{files.key}",
                    "--tls-trust-cert-path",
                    str(sb.pki.ca.cert_path),
                ]
                url = url or sb.https_url
        return run(*opts, *args, url=url or sb.http_url)

    return call


def ok(proc: CliResult) -> str:
    assert proc.returncode == 0, (proc.args, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def fails(proc: CliResult, *fragments: str) -> str:
    assert proc.returncode == 1, (proc.args, proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compactmq: error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def test_without_credentials_says_what_to_pass(cli):
    line = fails(cli("tenants", "list"), "HTTP 401", "--auth-plugin", "--auth-params")
    assert "Traceback" not in line


def test_bad_credentials_are_refused_and_never_printed(cli, sb):
    expired = sb.token(SUPERUSER, expires_in=-60)
    proc = run(
        "--auth-plugin", TOKEN, "--auth-params", f"token:{expired}", "tenants", "list", url=sb.http_url
    )
    fails(proc, "HTTP 401", "check the token credentials")
    assert expired not in proc.stderr + proc.stdout
    proc = run(
        "--auth-plugin",
        BASIC,
        "--auth-params",
        '{"userId":"ops","password":"not-the-password"}',
        "tenants",
        "list",
        url=sb.http_url,
    )
    fails(proc, "HTTP 401")
    assert "not-the-password" not in proc.stderr + proc.stdout
    fails(
        run("--auth-plugin", "kerberos", "--auth-params", "x", "tenants", "list", url=sb.http_url),
        "unsupported --auth-plugin",
    )


def test_superuser_sets_up_a_tenant_and_grants(cli):
    admin = ("token", SUPERUSER)
    ok(
        cli(
            "tenants",
            "create",
            "shop",
            "--admin-roles",
            "ops,shop-admin",
            "--allowed-clusters",
            "standalone",
            as_=admin,
        )
    )
    info = json.loads(ok(cli("tenants", "get", "shop", as_=admin, output="json")))
    assert info == {"adminRoles": ["ops", "shop-admin"], "allowedClusters": ["standalone"]}
    assert "shop" in json.loads(ok(cli("tenants", "list", as_=("token-file", SUPERUSER), output="json")))
    fails(cli("tenants", "create", "elsewhere", "--allowed-clusters", "mars", as_=admin), "HTTP 412", "mars")
    # the tenant admin (basic user "ops") runs the tenant's namespaces and grants
    ops = ("basic", "ops")
    ok(cli("namespaces", "create", "shop/orders", as_=ops))
    assert json.loads(ok(cli("namespaces", "topics", "shop/orders", as_=ops, output="json"))) == []
    fails(cli("namespaces", "topics", "shop/orders", "--mode", "ALL", as_=("token", "nobody")), "HTTP 403")
    out = ok(
        cli(
            "namespaces",
            "grant-permission",
            "shop/orders",
            "--role",
            "worker",
            "--actions",
            "produce,consume",
            as_=ops,
        )
    )
    assert "granted worker" in out
    assert json.loads(ok(cli("namespaces", "permissions", "shop/orders", as_=ops, output="json"))) == {
        "worker": ["consume", "produce"]
    }
    assert "worker: consume, produce" in ok(cli("namespaces", "permissions", "shop/orders", as_=ops))
    topic = "persistent://shop/orders/audit"
    ok(cli("topics", "grant-permission", topic, "--role", "auditor", "--actions", "consume", as_=ops))
    perms = json.loads(ok(cli("topics", "permissions", topic, as_=ops, output="json")))
    assert perms["auditor"] == ["consume"] and perms["worker"] == ["consume", "produce"]
    ok(cli("topics", "revoke-permission", topic, "--role", "auditor", as_=ops))
    fails(cli("topics", "revoke-permission", topic, "--role", "auditor", as_=ops), "HTTP 412")
    ok(cli("namespaces", "revoke-permission", "shop/orders", "--role", "worker", as_=ops))
    assert "no permissions granted" in ok(cli("namespaces", "permissions", "shop/orders", as_=ops))
    fails(
        cli("namespaces", "grant-permission", "shop/orders", "--role", "w", "--actions", "fly", as_=ops),
        "HTTP 400",
        "fly",
    )
    # ops administers shop, not the tenants themselves
    fails(cli("tenants", "create", "mine", as_=ops), "HTTP 403", "more rights")
    ok(cli("tenants", "update", "shop", "--admin-roles", "ops", as_=admin))
    assert json.loads(ok(cli("tenants", "get", "shop", as_=admin, output="json")))["adminRoles"] == ["ops"]


def test_tls_client_certificate_over_https(cli, sb):
    assert "public" in ok(cli("tenants", "list", as_=("tls", SUPERUSER)))
    fails(cli("tenants", "list", as_=("tls", "nobody-special")), "HTTP 403")
    # https without the CA: the broker's certificate is not trusted -- say how to fix it
    fails(
        run(
            "--auth-plugin",
            "token",
            "--auth-params",
            f"token:{sb.token(SUPERUSER)}",
            "tenants",
            "list",
            url=sb.https_url,
        ),
        "--tls-trust-cert-path",
    )
    assert "public" in ok(
        run(
            "--tls-allow-insecure",
            "--auth-plugin",
            "token",
            "--auth-params",
            f"token:{sb.token(SUPERUSER)}",
            "tenants",
            "list",
            url=sb.https_url,
        )
    )


def test_compaction_trigger_and_status_need_tenant_admin(cli, sb):
    import pulsar

    admin = ("token", SUPERUSER)
    ok(cli("tenants", "create", "plant", "--admin-roles", "plant-admin", as_=admin))
    ok(cli("namespaces", "create", "plant/sensors", as_=("token", "plant-admin")))
    ok(
        cli(
            "namespaces",
            "grant-permission",
            "plant/sensors",
            "--role",
            "sensor",
            "--actions",
            "produce",
            as_=("token", "plant-admin"),
        )
    )
    topic = "persistent://plant/sensors/temperature"
    client = make_client(sb.broker.url, authentication=pulsar.AuthenticationToken(sb.token("sensor")))
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(30):
            producer.send(f"{20 + i % 7}C".encode(), partition_key=f"room-{i % 5}")
        producer.close()
    finally:
        client.close()
    fails(cli("topics", "compact", topic, as_=("token", "sensor")), "HTTP 403", "more rights")
    fails(cli("topics", "compact", topic, as_=("tls", "sensor")), "HTTP 403")  # over https, a client cert
    fails(cli("topics", "compact", topic), "HTTP 401")
    expired = sb.token("plant-admin", expires_in=-60)
    fails(
        run(
            "--auth-plugin",
            TOKEN,
            "--auth-params",
            f"token:{expired}",
            "topics",
            "compact",
            topic,
            url=sb.http_url,
        ),
        "HTTP 401",
    )
    fails(cli("topics", "compaction-status", topic, as_=("token", "sensor")), "HTTP 403")
    fails(cli("topics", "set-compaction-threshold", topic, "-t", "1M", as_=("token", "sensor")), "HTTP 403")
    out = ok(cli("topics", "compact", topic, "--wait", as_=("token", "plant-admin")))
    assert "SUCCESS" in out
    status = json.loads(
        ok(cli("topics", "compaction-status", topic, as_=("token", "plant-admin"), output="json"))
    )
    assert status["status"] == "SUCCESS"
    # the tenant admin's certificate over https (pulsar-admin's --tls-* options) works the same
    over_tls = json.loads(
        ok(cli("topics", "compaction-status", topic, as_=("tls", "plant-admin"), output="json"))
    )
    assert over_tls["status"] == "SUCCESS"
    ok(cli("topics", "compact", topic, "--wait", as_=("tls", "plant-admin")))
    ok(cli("topics", "set-compaction-threshold", topic, "-t", "1M", as_=("token", "plant-admin")))
