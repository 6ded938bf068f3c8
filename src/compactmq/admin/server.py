"""The web service on the broker's web port: ``start(service, host, port)`` is the plug
``BrokerServer.start_web`` calls; the object it returns is closed first at shutdown (the broker
stops accepting HTTP before it closes its topics)."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from ..errors import StorageError
from .app import build_app
from .metrics import TrafficSampler

log = logging.getLogger(__name__)


class WebService:
    def __init__(self, runner: web.AppRunner, sampler: TrafficSampler, url: str) -> None:
        self.runner = runner
        self.sampler = sampler
        self.url = url

    async def close(self) -> None:
        await self.sampler.stop()
        await self.runner.cleanup()


async def start(service: Any, host: str, port: int) -> WebService:
    sampler = TrafficSampler(service)
    app = build_app(service, sampler)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise StorageError(f"cannot listen on {host}:{port} for the web service: {e.strerror}") from None
    sampler.start()
    url = f"http://{host}:{port}"
    log.info("web service (admin REST API, /metrics) on %s", url)
    return WebService(runner, sampler, url)
