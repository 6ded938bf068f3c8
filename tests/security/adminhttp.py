"""What the admin-side security tests share: a secured broker subprocess (token, basic and TLS
providers, authorization, the TLS web port) and an HTTP client that speaks as a given role."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from admin.harness import start_broker  # tests/ is on sys.path
from broker.conftest import BrokerProcess, free_port

from .helpers import Pki, file_url, mint_token, secret_key, write_htpasswd

PROVIDERS = ",".join(
    f"org.apache.pulsar.broker.authentication.AuthenticationProvider{p}" for p in ("Token", "Basic", "Tls")
)
SUPERUSER = "admin"
PASSWORDS = {"ops": "ops-secret-1", "alice": "alice-secret-2"}  # basic users (role = user name)


@dataclass
class SecuredBroker:
    broker: BrokerProcess
    secret: bytes
    tls_port: int
    pki: Pki

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.broker.web_port}"

    @property
    def https_url(self) -> str:
        return f"https://127.0.0.1:{self.tls_port}"

    def token(self, role: str, **kw: Any) -> str:
        return mint_token(role, self.secret, **kw)

    def as_token(self, role: str, **kw: Any) -> "HttpAs":
        return HttpAs(self.http_url, {"Authorization": f"Bearer {self.token(role, **kw)}"})

    def as_basic(self, user: str, password: str | None = None) -> "HttpAs":
        pair = f"{user}:{PASSWORDS[user] if password is None else password}".encode()
        return HttpAs(self.http_url, {"Authorization": "Basic " + base64.b64encode(pair).decode()})

    def anonymous(self) -> "HttpAs":
        return HttpAs(self.http_url, {})

    def as_cert(self, common_name: str | None, trusted: bool = True) -> "HttpAs":
        ctx = ssl.create_default_context(cafile=str(self.pki.ca.cert_path))
        if common_name is not None:
            files = self.pki.client(common_name) if trusted else self.pki.untrusted_client(common_name)
            ctx.load_cert_chain(str(files.cert), str(files.key))
        return HttpAs(self.https_url, {}, ctx)


def start_secured_broker(directory: Path, pki: Pki, **overrides: str) -> SecuredBroker:
    """A broker with authentication (token HS256, basic, TLS) and authorization on, ``admin`` the
    superuser, and the HTTPS web port beside the plain one."""
    secret = secret_key()
    (directory / "secret.key").write_bytes(secret)
    htpasswd = write_htpasswd(directory / "htpasswd", PASSWORDS)
    tls_port = free_port()
    broker = start_broker(
        directory / "data",
        authenticationEnabled="true",
        authorizationEnabled="true",
        authenticationProviders=PROVIDERS,
        superUserRoles=SUPERUSER,
        tokenSecretKey=file_url(directory / "secret.key"),
        # the broker's own admin client is a superuser: it creates public/default (as on Pulsar)
        brokerClientAuthenticationPlugin="org.apache.pulsar.client.impl.auth.AuthenticationToken",
        brokerClientAuthenticationParameters="token:" + mint_token(SUPERUSER, secret),
        basicAuthConf=str(htpasswd),
        webServicePortTls=str(tls_port),
        tlsCertificateFilePath=str(pki.server.cert),
        tlsKeyFilePath=str(pki.server.key),
        tlsTrustCertsFilePath=str(pki.ca.cert_path),
        **overrides,
    )
    return SecuredBroker(broker, secret, tls_port, pki)


class HttpAs:
    """``call(method, path, body)`` -> (status, parsed body, headers), with fixed request headers."""

    def __init__(self, base: str, headers: dict[str, str], tls: ssl.SSLContext | None = None) -> None:
        self.base = base.rstrip("/")
        self.headers = headers
        self.tls = tls

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = dict(self.headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.tls) as resp:
                status, payload, got = resp.status, resp.read(), resp.headers
        except urllib.error.HTTPError as e:
            status, payload, got = e.code, e.read(), e.headers
        if not payload:
            return status, None, got
        if "json" in got.get("Content-Type", ""):
            return status, json.loads(payload), got
        return status, payload.decode(), got

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, out, _ = self.call(method, path, body)
        want = 204 if method in ("PUT", "POST", "DELETE") else 200
        assert status == want, (method, path, status, out)
        return out

    def error(self, method: str, path: str, status: int, body: Any = None) -> str:
        got, out, _ = self.call(method, path, body)
        assert got == status, (method, path, got, out)
        assert isinstance(out, dict) and isinstance(out.get("reason"), str) and out["reason"], out
        return out["reason"]
