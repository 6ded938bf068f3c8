"""``cli.standalone.build_server``: the entry point builds every collaborator the broker is given,
and a bad setting is refused before storage opens (nothing is created on disk)."""

from __future__ import annotations

import asyncio

import pytest

from compactmq.auth import AuthenticationService
from compactmq.broker.server import BrokerServer
from compactmq.cli.standalone import build_server
from compactmq.config import load_config
from compactmq.errors import InvalidConfiguration
from compactmq.spark.auto_export import export_after_compaction


def _config(data_dir, **overrides):
    return load_config(overrides={"dataDir": str(data_dir), "compactionSparkWarmup": "false", **overrides})


@pytest.mark.parametrize(
    "overrides, reason",
    [
        ({"brokerServicePort": ""}, "brokerServicePort is empty"),
        ({"brokerServicePortTls": "0"}, "tlsCertificateFilePath"),
        ({"authenticationEnabled": "true"}, "authenticationProviders"),
    ],
)
def test_a_bad_setting_is_refused_before_storage_opens(tmp_path, overrides, reason):
    data = tmp_path / "data"
    with pytest.raises(InvalidConfiguration, match=reason):
        asyncio.run(build_server(_config(data, **overrides)))
    assert not data.exists()  # storage never opened


def test_the_server_is_handed_its_collaborators_built(tmp_path):
    async def build() -> BrokerServer:
        return await build_server(_config(tmp_path / "data"))

    server = asyncio.run(build())
    service = server.service
    try:
        assert isinstance(service.authentication, AuthenticationService)
        assert not service.authentication.enabled
        assert service.post_compaction_hooks == (export_after_compaction,)
        assert service.compaction_monitor.service is service
        assert service.credential_refresher.service is service
        # the default namespace exists before any port listens, as a Pulsar standalone makes it
        assert service.storage.resources.namespaces.exists("public/default")
    finally:
        service.executor.shutdown()
        service.storage.close()
