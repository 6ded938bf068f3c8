"""The CLI's client of the admin REST API: one HTTP call, its errors as one line, and the paths.

``AdminClient.request(method, path, body, query)`` sends one call (stdlib ``urllib`` only: the
CLI must start fast) with the credentials and TLS the global options describe (``admin_auth``),
follows a cluster's 307 to the broker that owns the topic, and answers the decoded JSON. A
refused call raises ``AdminRequestError`` carrying the broker's ``reason`` and, for 401/403,
what to do next. ``topic_path`` and ``namespace_path`` turn a user's names into Pulsar's v2
paths; ``run_command`` wraps a command ``fn(args, client, output)`` as an argparse ``func``.
"""

from __future__ import annotations

import argparse
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable

from ..errors import AdminRequestError, InvalidInput
from ..naming import TopicName
from .admin_auth import ClientAuth, client_auth, ssl_context
from .output import Output


#: 307s followed for one call (a non-owner to the leader to the owner is two)
MAX_REDIRECTS = 5


class AdminClient:
    """Minimal HTTP client for the admin REST API (stdlib only: the CLI must start fast)."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 30.0,
        auth: ClientAuth | None = None,
        tls: ssl.SSLContext | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.auth = auth or ClientAuth()
        self.tls = tls

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AdminClient:
        """The client the global options describe (admin URL, credentials, TLS)."""
        auth = client_auth(
            args.auth_plugin,
            args.auth_params,
            args.tls_cert_file,
            args.tls_key_file,
        )
        tls = None
        if args.admin_url.lower().startswith("https://"):
            tls = ssl_context(
                args.tls_trust_cert_path,
                args.tls_allow_insecure,
                args.tls_enable_hostname_verification,
                auth,
            )
        elif auth.method == "tls":
            raise InvalidInput(
                "TLS authentication needs an https:// --admin-url (the broker's webServicePortTls)"
            )
        return cls(args.admin_url, auth=auth, tls=tls)

    def request(self, method: str, path: str, body: Any = None, query: dict | None = None) -> Any:
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None
        headers = {"Accept": "application/json"}
        if self.auth.authorization:
            headers["Authorization"] = self.auth.authorization
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            raw = self._send_following_redirects(url, data, method, headers)
        except urllib.error.HTTPError as e:
            raise AdminRequestError(
                f"{_reason(e)} (HTTP {e.code}){self._next_step(e.code)}", e.code
            ) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLError):
                raise AdminRequestError(
                    f"TLS with the admin API at {self.base_url} failed ({_tls_reason(e.reason)}); "
                    "pass the broker's CA with --tls-trust-cert-path (or --tls-allow-insecure)"
                ) from None
            raise AdminRequestError(
                f"cannot reach the admin API at {self.base_url} ({e.reason}); "
                "is the broker running? (set --admin-url)"
            ) from None
        except ssl.SSLError as e:
            raise AdminRequestError(
                f"TLS with the admin API at {self.base_url} failed ({_tls_reason(e)})"
            ) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def _send_following_redirects(self, url: str, data: bytes | None, method: str, headers: dict) -> bytes:
        """The response body; a 307/308 (a cluster's broker sending the call to the owner of the
        topic or bundle) is followed with the same method and body, up to ``MAX_REDIRECTS`` times,
        never from https:// to http://."""
        for _ in range(MAX_REDIRECTS):
            req = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout, context=self.tls) as resp:
                    return resp.read()
            except urllib.error.HTTPError as e:
                location = e.headers.get("Location") if e.code in (307, 308) else None
                if not location:
                    raise
                target = urllib.parse.urljoin(url, location)
                if url.lower().startswith("https://") and not target.lower().startswith("https://"):
                    raise
                url = target
        raise AdminRequestError(f"more than {MAX_REDIRECTS} redirects from the admin API at {self.base_url}")

    def _next_step(self, status: int) -> str:
        """What to do after a 401 or 403, appended to the broker's reason."""
        if status == 401 and self.auth.method is None:
            return (
                "; the broker requires authentication: pass --auth-plugin token --auth-params "
                "token:<jwt> (or file:///path), basic, or tls with a client certificate"
            )
        if status == 401:
            return f"; check the {self.auth.method} credentials given with --auth-params"
        if status == 403:
            return "; this needs a role with more rights (the tenant's admin role or a superuser)"
        return ""


def _tls_reason(e: ssl.SSLError) -> str:
    # verify_message only on SSLCertVerificationError, reason only on some SSLErrors
    return getattr(e, "verify_message", None) or getattr(e, "reason", None) or type(e).__name__


def _reason(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read() or b"{}")
        if isinstance(body, dict) and body.get("reason"):
            return str(body["reason"])
    except ValueError:
        pass
    return e.reason or "request failed"


def topic_path(name: str) -> str:
    t = TopicName.parse(name)
    local = urllib.parse.quote(t.local_name, safe="")
    return f"/admin/v2/{t.domain}/{t.tenant}/{t.namespace}/{local}"


def namespace_path(name: str) -> str:
    parts = name.split("/")
    if len(parts) != 2 or not all(parts):
        raise InvalidInput(f"invalid namespace {name!r}: expected tenant/namespace")
    return f"/admin/v2/namespaces/{parts[0]}/{parts[1]}"


def run_command(fn: Callable[[argparse.Namespace, AdminClient, Output], Any]):
    """An argparse ``func`` that calls ``fn`` with the client the global options describe."""

    def run(args: argparse.Namespace) -> int:
        result = fn(args, AdminClient.from_args(args), Output(args.output))
        return result if isinstance(result, int) else 0

    return run
