"""``objectLedgerStorageUrl``: the object store managed ledgers are written to, from one URL.

Empty (the default) keeps ledgers on local disk. Otherwise the broker writes every managed
ledger through ``object_ledgers.ObjectLedgerStorage`` to the store the URL names::

    s3://BUCKET[/PREFIX][?region=REGION&endpoint=http://HOST:PORT]   any S3-compatible store
    file:///ABSOLUTE/DIR                                             a directory (one machine, tests)

(``endpoint_override=HOST:PORT&scheme=http``, the form ``OffloadLocation.url`` writes and
``blobstore.location_from_url`` reads, is accepted for the endpoint too.) Credentials are never
part of the URL: the AWS SDK's default chain finds them, as for tiered storage.

The value is the operator's (broker.conf), but it still names a path and a URL the broker
connects to, so it goes through one rule before either is built, the one tiered storage applies
to its locations: a known driver, a bucket name S3 accepts, prefix segments of plain characters
(no ``.``/``..``, nothing percent-encoded), an endpoint that is only ``http(s)://host[:port]``
(no user info, path or query), no credentials anywhere, no unknown parameter. Anything else is
``InvalidConfiguration`` with one line that says what is wrong, at broker start.
"""

from __future__ import annotations

import os
import re
from urllib.parse import parse_qs, urlparse

from ..errors import InvalidConfiguration
from .offload.blobstore import OffloadLocation

KEY = "objectLedgerStorageUrl"

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SEGMENT = re.compile(r"^[A-Za-z0-9_.-]+$")
_REGION = re.compile(r"^[a-z0-9-]{1,40}$")
_HOST_PORT = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]{1,5})?$|^\[[0-9a-fA-F:]+\](:[0-9]{1,5})?$")
_QUERY_KEYS = {"region", "endpoint", "endpoint_override", "scheme"}


def _bad(url: str, why: str) -> InvalidConfiguration:
    return InvalidConfiguration(f"{KEY}={url[:200]!r}: {why}")


def _segments(url: str, path: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    for p in parts:
        if p in (".", "..") or not _SEGMENT.match(p):
            raise _bad(url, f"path segment {p[:50]!r} is not plain (letters, digits, '_', '.', '-')")
    return parts


def _endpoint(url: str, query: dict[str, str]) -> str:
    """``scheme://host[:port]`` of an S3 endpoint, or "" (the SDK's default for the region)."""
    if "endpoint" in query:
        e = urlparse(query["endpoint"])
        if e.scheme not in ("http", "https") or not e.netloc or e.path not in ("", "/") or e.query:
            raise _bad(url, "endpoint must be http(s)://host[:port] and nothing more")
        scheme, netloc = e.scheme, e.netloc
    elif "endpoint_override" in query:
        scheme, netloc = query.get("scheme") or "https", query["endpoint_override"]
        if scheme not in ("http", "https"):
            raise _bad(url, "scheme must be http or https")
    else:
        return ""
    if "@" in netloc or not _HOST_PORT.match(netloc):
        raise _bad(url, "endpoint must be host[:port] (no user info)")
    return f"{scheme}://{netloc}"


def location_of(url: str) -> OffloadLocation | None:
    """The object store ``url`` names (None: empty, ledgers stay on local disk)."""
    url = (url or "").strip()
    if not url:
        return None
    try:
        u = urlparse(url)
        u.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        raise _bad(url, f"not a URL ({exc})") from None
    if u.username is not None or u.password is not None or "@" in u.netloc:
        raise _bad(url, "credentials never go in the URL (the AWS SDK's default chain finds them)")
    if u.fragment or u.params:
        raise _bad(url, "no fragment or parameters")
    raw = parse_qs(u.query, keep_blank_values=True, strict_parsing=False)
    query = {k: v[-1] for k, v in raw.items()}
    unknown = sorted(set(query) - _QUERY_KEYS)
    if unknown:
        raise _bad(url, f"unknown parameter(s) {', '.join(unknown)[:100]} (expected region, endpoint)")
    scheme = u.scheme.lower()
    if scheme == "s3":
        if not _BUCKET.match(u.netloc):
            raise _bad(url, "a bucket name of 3-63 lowercase letters, digits, '.' or '-' is needed")
        region = query.get("region") or ""
        if region and not _REGION.match(region):
            raise _bad(url, "region must be lowercase letters, digits and '-'")
        prefix = "/".join(_segments(url, u.path))
        return OffloadLocation("s3", u.netloc, region, _endpoint(url, query), prefix)
    if scheme == "file":
        if u.netloc or query:
            raise _bad(url, "a file URL is file:///absolute/dir (no host, no parameters)")
        parts = _segments(url, u.path)
        if not parts:
            raise _bad(url, "the root directory is not a ledger store")
        return OffloadLocation("filesystem", os.sep + os.path.join(*parts))
    raise _bad(url, "expected s3://bucket[/prefix][?region=..&endpoint=..] or file:///dir")
