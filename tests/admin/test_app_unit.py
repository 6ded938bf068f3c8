"""The admin app in process (no broker subprocess): routing on raw segments, the error mapping
(404, 405 with Allow, 500 for an unexpected failure, 503 for a part that is not ready), the
policy validators and the OpenAPI document. The app serves a real ``BrokerService`` (not started:
no ports, no compaction checks)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from compactmq.admin.app import build_app, build_router
from compactmq.admin.common import PreconditionFailed
from compactmq.admin.policies import POLICIES
from compactmq.admin.router import NoRoute, openapi_document
from compactmq.config import load_config
from compactmq.broker.server import BrokerService
from compactmq.errors import InvalidInput, ServiceNotReady
from compactmq.storage import Storage


@pytest.fixture
def service(tmp_path):
    config = load_config(overrides={"dataDir": str(tmp_path / "data")})
    storage = Storage(tmp_path / "data", config)
    svc = BrokerService(config, storage)  # no authentication given: none (grants still stored)
    yield svc
    svc.executor.shutdown()
    storage.close()


def request_all(service, calls):
    """Run ``calls`` [(method, path, json)] against the app; returns [(status, headers, body)]."""

    async def run():
        async with TestClient(TestServer(build_app(service))) as client:
            out = []
            for method, path, body in calls:
                resp = await client.request(method, path, json=body)
                payload = await resp.json() if resp.content_type == "application/json" else await resp.text()
                out.append((resp.status, resp.headers, payload))
            return out

    return asyncio.run(run())


def test_error_mapping(service, monkeypatch):
    def boom():
        raise RuntimeError("disk on fire")

    def not_ready(*args):
        raise ServiceNotReady("the metadata store is reconnecting")

    monkeypatch.setattr(service.storage.resources.tenants, "list_tenants", boom)
    monkeypatch.setattr(service.storage.resources.namespaces, "list_namespaces", not_ready)
    (s404, _, b404), (s405, h405, b405), (s500, _, b500), (s503, _, b503), (s_other, _, b_other) = (
        request_all(
            service,
            [
                ("GET", "/admin/v2/nothing/here", None),
                ("PATCH", "/admin/v2/persistent/public/default/t/compaction", None),
                ("GET", "/admin/v2/tenants", None),
                ("GET", "/admin/v2/namespaces/public", None),
                ("GET", "/elsewhere", None),
            ],
        )
    )
    assert s404 == 404 and "no such admin path" in b404["reason"]
    assert s405 == 405 and h405["Allow"] == "GET, PUT" and b405["reason"]
    assert s500 == 500 and "disk on fire" in b500["reason"]
    assert s503 == 503 and "reconnecting" in b503["reason"]
    assert s_other == 404 and b_other["reason"]


def test_topic_names_with_encoded_characters(service):
    results = request_all(
        service,
        [
            ("PUT", "/admin/v2/persistent/public/default/odd%3Aname", None),
            ("GET", "/admin/v2/persistent/public/default", None),
        ],
    )
    assert results[0][0] == 204
    assert results[1][2] == ["persistent://public/default/odd:name"]
    route, captures = build_router().match("GET", "/admin/v2/persistent/public/default/a%2Fb%20c/stats")
    assert captures["topic"] == "a/b c" and route.handler.__name__ == "topic_stats"  # one segment


def test_router_domain_segment_and_allowed_methods():
    router = build_router()
    route, captures = router.match("GET", "/admin/v2/namespaces/public/default")
    assert route.handler.__name__ == "get_namespace_policies"
    with pytest.raises(NoRoute) as e:
        router.match("GET", "/admin/v2/other-domain/public/default/t/stats")
    assert e.value.allowed == []
    with pytest.raises(NoRoute) as e:
        router.match("POST", "/admin/v2/persistent/public/default/t/stats")
    assert e.value.allowed == ["GET"]


@pytest.mark.parametrize(
    "path, body, error",
    [
        ("compactionThreshold", -1, PreconditionFailed),
        ("compactionThreshold", "ten", InvalidInput),
        ("compactionThreshold", True, InvalidInput),
        ("retention", {"retentionTimeInMinutes": 1}, InvalidInput),
        ("retention", {"retentionTimeInMinutes": -2, "retentionSizeInMB": 0}, PreconditionFailed),
        ("compactionStrategy", "", InvalidInput),
        ("compactionStrategy", "latest-wins", PreconditionFailed),
        ("compactionRetainNullKey", "maybe", InvalidInput),
        ("compactionRetentionMode", "forever", PreconditionFailed),
    ],
)
def test_policy_validation(path, body, error):
    from compactmq.auth.policy_rules import Target, check_policy_values
    from compactmq.config import load_config

    policy = next(p for p in POLICIES if p.path == path)
    with pytest.raises(error):  # the parser (shape) or the rule of the value (security)
        check_policy_values(policy.parse(body), Target(load_config(), "public/default"))


def test_policy_round_trip():
    by_path = {p.path: p for p in POLICIES}
    for path, body in (
        ("compactionThreshold", 1024),
        ("compactionStrategy", "keep-first"),
        ("compactionRetainNullKey", False),
        ("compactionRetentionMode", "keep-until-tombstone"),
        ("retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": 5}),
    ):
        policy = by_path[path]
        assert policy.render(policy.parse(body)) == body
        assert policy.render({}) is None


def test_openapi_lists_every_route_once():
    router = build_router()
    doc = openapi_document(router, "t", "1")
    ops = [(path, method) for path, item in doc["paths"].items() for method in item]
    assert len(ops) == len({(r.pattern, r.method.lower()) for r in router.routes})
    assert all("summary" in op for item in doc["paths"].values() for op in item.values())
