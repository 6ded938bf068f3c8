"""The official Python client's CI setup, unchanged, leaves compactmq as it leaves Pulsar.

Pulsar's standalone creates ``public``/``public/default`` through its own admin client; with
upstream's configuration (authorization on, no broker-client credentials, ``anonymous`` not a
superuser) that client is refused, so nothing is created and the setup script's PUTs create
them -- ``public`` with ``anonymous`` as its admin, ``public/default`` with ``anonymous`` granted
produce and consume. Had the broker created them first, the PUTs would answer 409 and every
anonymous test of the client's suite would fail with AuthorizationError.
"""

from __future__ import annotations

import pytest
from broker.conftest import make_client  # tests/ is on sys.path

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ci_ready(upstream_ci):
    """(the tenants before the script, the script's statuses), once per module."""
    before = upstream_ci.admin().ok("GET", "/admin/v2/tenants")
    return before, upstream_ci.run_setup_script()


def test_setup_script_creates_and_grants_the_default_namespace(upstream_ci, ci_ready):
    before, statuses = ci_ready
    assert "public" not in before  # the broker's own admin client could not create it
    assert statuses["tenants/public"] == 204
    assert statuses["namespaces/public/default"] == 204
    assert statuses["namespaces/public/default-2"] == 204
    assert statuses["tenants/private"] == 204 and statuses["namespaces/private/auth"] == 204
    admin = upstream_ci.admin()
    assert admin.ok("GET", "/admin/v2/tenants/public")["adminRoles"] == ["anonymous"]
    assert admin.ok("GET", "/admin/v2/namespaces/public/default/permissions") == {
        "anonymous": ["consume", "produce"]
    }
    log = upstream_ci.log_path.read_text()
    assert "public/default not created" in log and "not a superuser" in log


def test_anonymous_client_produces_and_consumes_on_public_default(upstream_ci, ci_ready):
    client = make_client(upstream_ci.service_url)
    try:
        consumer = client.subscribe("anonymous-round-trip", "s")
        client.create_producer("anonymous-round-trip").send(b"hi")
        assert consumer.receive(10_000).data() == b"hi"
    finally:
        client.close()
