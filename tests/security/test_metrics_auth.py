"""``/metrics`` with authentication on: closed by default (its series name every tenant's
topics), open only when ``authenticateMetricsEndpoint=false`` is set explicitly. (The default
case, on the broker of ``test_admin_auth``, is ``test_metrics_need_credentials_when_authentication_is_on``.)
"""

from __future__ import annotations

import pytest

from compactmq.config import load_config, metrics_need_authentication

from .adminhttp import start_secured_broker


@pytest.mark.parametrize(
    "keys, expected",
    [
        ({}, False),
        ({"authenticationEnabled": "true"}, True),
        ({"authenticationEnabled": "true", "authenticateMetricsEndpoint": "false"}, False),
        ({"authenticationEnabled": "true", "authenticateMetricsEndpoint": ""}, True),  # empty: the default
        ({"authenticateMetricsEndpoint": "true"}, True),
    ],
)
def test_the_rule(keys, expected):
    assert metrics_need_authentication(load_config(overrides=keys)) is expected


@pytest.fixture(scope="module")
def opened(tmp_path_factory, pki):
    s = start_secured_broker(
        tmp_path_factory.mktemp("metrics-open"), pki, authenticateMetricsEndpoint="false"
    )
    yield s
    s.broker.stop()


def test_explicit_false_opens_metrics_and_nothing_else(opened):
    status, text, _ = opened.anonymous().call("GET", "/metrics")
    assert status == 200 and "pulsar_" in text
    assert opened.anonymous().call("GET", "/admin/v2/tenants")[0] == 401
