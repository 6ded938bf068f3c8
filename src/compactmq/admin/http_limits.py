"""What an HTTP peer may cost the web port before (and while) it is authenticated.

Authentication needs the request's headers, so anyone who can reach the port can make the
server hold a connection, a header buffer and, for requests with a body, the body. Each is
bounded, from the broker config:

* **Headers in time** (``httpRequestHeaderTimeoutSeconds``, compactmq's own key, default 30):
  a connection must deliver a complete request line and headers within this many seconds of
  being accepted (or of its previous response, on a kept-alive connection), else it is closed.
  Bytes that arrive meanwhile do not extend it, so a peer trickling a header byte at a time is
  closed as surely as a silent one. This is aiohttp's keep-alive timer, which starts at accept
  and is reset only by a response; it also closes idle kept-alive connections after as long.
* **Header size** (``httpMaxRequestHeaderSize``, Pulsar's key, default 8 KiB): the longest
  request line and the longest header field; at most ``MAX_HEADERS`` fields. Larger is a 400.
* **Body in time** (``httpRequestBodyTimeoutSeconds``, compactmq's own key, default 30): the
  whole body must arrive within this many seconds of its headers; else 408 and the connection
  closes. The body is read (and kept: handlers read the cached copy) before the handler runs.
* **Body size** (``httpMaxRequestSize``, Pulsar's key): larger is a 413. Pulsar's default
  (-1) means no limit; here any value <= 0 means ``DEFAULT_MAX_BODY`` (1 MiB), so the web port
  never buffers an unbounded body.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.typedefs import Middleware

from ..config import int_setting

#: the body limit when ``httpMaxRequestSize`` is <= 0 (Pulsar's "no limit")
DEFAULT_MAX_BODY = 1024 * 1024
#: most header fields in one request (aiohttp's own default)
MAX_HEADERS = 128


def max_body_size(config: Mapping[str, Any]) -> int:
    size = int_setting(config, "httpMaxRequestSize")
    return size if size > 0 else DEFAULT_MAX_BODY


def handler_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments for ``web.AppRunner``: the header deadline and size limits."""
    header_size = max(256, int_setting(config, "httpMaxRequestHeaderSize"))
    return {
        "keepalive_timeout": max(1, int_setting(config, "httpRequestHeaderTimeoutSeconds")),
        "max_line_size": header_size,
        "max_field_size": header_size,
        "max_headers": MAX_HEADERS,
        # no "lingering" read of a body a response left unread (aiohttp's default waits 10 s
        # more for it): the body deadline and size limit are the last word on a request
        "lingering_time": 0,
    }


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def body_deadline_middleware(
    config: Mapping[str, Any], error_response: Callable[[int, str], web.Response]
) -> Middleware:
    """A middleware that reads the request body within ``httpRequestBodyTimeoutSeconds``."""
    timeout = max(1, int_setting(config, "httpRequestBodyTimeoutSeconds"))
    limit = max_body_size(config)

    @web.middleware
    async def read_body_in_time(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.can_read_body:
            try:
                await asyncio.wait_for(request.read(), timeout)  # cached for the handler
            except asyncio.TimeoutError:
                response = error_response(408, f"the request body did not arrive within {timeout} s")
                response.force_close()
                return response
            except web.HTTPRequestEntityTooLarge:
                response = error_response(413, f"request body larger than {limit} bytes (httpMaxRequestSize)")
                response.force_close()
                return response
        return await handler(request)

    return read_body_in_time
