"""The web service on the broker's web port(s): ``start(service, host, port, ssl_context=None,
tls_port=None)`` is the web-service starter the entry point (``cli/standalone.py``) hands to
``BrokerServer``. One aiohttp application serves the plain port and, when the broker has a TLS
context and ``webServicePortTls``, the same application over HTTPS on the TLS port (the admin
app reads a verified client certificate from the request's transport). The object it returns
is closed first at shutdown (the broker stops accepting HTTP before it closes its topics).
"""

from __future__ import annotations

import logging
import ssl
from typing import TYPE_CHECKING

from aiohttp import web

from ..errors import StorageError
from . import http_limits
from .app import build_app
from .metrics import TrafficSampler

if TYPE_CHECKING:
    from ..broker.server import BrokerService

log = logging.getLogger(__name__)


class WebService:
    def __init__(
        self, runner: web.AppRunner, sampler: TrafficSampler, port: int | None, tls_port: int | None
    ) -> None:
        self.runner = runner
        self.sampler = sampler
        self.port = port
        self.tls_port = tls_port

    async def close(self) -> None:
        listeners = self.sampler.service.topics.deleted_listeners
        if self.sampler.forget in listeners:
            listeners.remove(self.sampler.forget)
        await self.sampler.stop()
        await self.runner.cleanup()


async def _start_site(runner: web.AppRunner, host: str, port: int, ssl_context: ssl.SSLContext | None) -> int:
    site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=ssl_context)
    known = len(runner.addresses)
    try:
        await site.start()
    except OSError as e:
        what = "TLS port " if ssl_context is not None else ""
        raise StorageError(
            f"cannot listen on {what}{host}:{port} for the web service: {e.strerror}"
        ) from None
    added = runner.addresses[known:]  # the port bound (a requested 0 means any free port)
    return added[0][1] if added else port


async def start(
    service: BrokerService,
    host: str,
    port: int | None,
    ssl_context: ssl.SSLContext | None = None,
    tls_port: int | None = None,
) -> WebService:
    """Serve the admin app on ``port`` (None: no plain HTTP, ``webServicePort`` empty) and over
    HTTPS on ``tls_port`` when there is a TLS context."""
    sampler = TrafficSampler(service)
    app = build_app(service, sampler)
    # header deadline and sizes (http_limits); the body's are the app's middleware
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, **http_limits.handler_settings(service.config)
    )
    await runner.setup()
    try:
        if port is not None:
            port = await _start_site(runner, host, port, None)
        if ssl_context is not None and tls_port is not None:
            tls_port = await _start_site(runner, host, tls_port, ssl_context)
        else:
            tls_port = None
    except BaseException:
        await runner.cleanup()
        raise
    sampler.start()
    # a topic the broker deletes by itself (inactive_topics) takes its traffic counters along:
    # kept, they would grow with every topic the broker ever served
    service.topics.deleted_listeners.append(sampler.forget)
    log.info(
        "web service (admin REST API, /metrics) on %s: %s%s",
        host,
        f"http {port}" if port is not None else "no plain http",
        f", https {tls_port}" if tls_port is not None else "",
    )
    return WebService(runner, sampler, port, tls_port)
