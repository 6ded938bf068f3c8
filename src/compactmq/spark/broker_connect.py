"""How the entry reader (``broker_entries``) reaches a secured broker: TLS and credentials.

A Spark task that reads a split as whole entries opens its own socket to the broker and speaks
the binary protocol itself, so it has to do what the official client does before CONNECT: wrap
the socket in TLS for a ``pulsar+ssl://`` service URL, and put the role's credential into
CONNECT. It reads the same ``pulsar.client.*`` options as the client path (``options``), with the
Java client's names, so one set of options serves both paths:

* ``tlsTrustCertsFilePath``: the CA certificates (PEM) the broker's certificate must chain to
  (without it: the system's trust store);
* ``tlsHostnameVerificationEnable`` / ``tlsValidateHostname``: the certificate must name the host
  dialled (default true, as ``options.client_kwargs`` makes it for the official client);
* ``tlsAllowInsecureConnection``: any certificate is accepted (and no name checked);
* ``tlsCertificateFilePath`` / ``tlsKeyFilePath``, or the TLS auth plugin's ``tlsCertFile`` /
  ``tlsKeyFile``: the client certificate presented (TLS authentication);
* ``authPluginClassName`` + ``authParams``: token (``token:<jwt>`` or the bare token) and basic
  (``{"userId","password"}`` or ``userId:u,password:p``) become CONNECT's ``auth_method_name`` /
  ``auth_data``, as Pulsar's clients send them; the TLS plugin sends method ``tls``. Any other
  plugin is ``Unsupported`` here: the split is read with the official client, which loads it.

Secrets: a ``Connection`` keeps its credential in a field kept out of ``repr``; errors name the
option to set, never its value (``scrub`` removes the credential from anything the broker says).

**File options are untrusted values with one rule.** ``tlsTrustCertsFilePath`` and the
certificate/key paths come from the job's options. The Spark executor opens them only as what
the option says they are -- PEM files parsed by ``ssl`` (``load_verify_locations`` /
``load_cert_chain``), never imported, executed, fetched as a URL or echoed -- and with the
executor's own permissions, i.e. the permissions of the job whose code already runs there. So an
option can only name a file the user could read for themselves anyway; its contents never appear
in an error (a file that does not parse says which option to fix). A value with a URL scheme
(``://``) is refused rather than guessed at.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import CompactMQError, InvalidConfiguration
from .options import _basic_credentials, _bool, _plugin_kind, _tls_files

#: pulsar.client.* options the entry reader applies itself (lower case); any other one is read
#: with the official client (``Unsupported``), which rejects what it does not know either
KNOWN = frozenset(
    {
        "authpluginclassname",
        "authparams",
        "tlstrustcertsfilepath",
        "tlsallowinsecureconnection",
        "tlsvalidatehostname",
        "tlshostnameverificationenable",
        "tlscertificatefilepath",
        "tlskeyfilepath",
        "operationtimeoutms",
        "operationtimeoutseconds",
        "connectiontimeoutms",
        "iothreads",  # the official client's thread count: nothing to do with one socket
    }
)
DEFAULT_PORTS = {"pulsar": 6650, "pulsar+ssl": 6651}


class Unsupported(CompactMQError):
    """This connection needs more than the entry reader speaks (a redirect, another auth plugin)."""


@dataclass(frozen=True)
class Connection:
    """Where and how to connect: address, TLS context (None: plain TCP), CONNECT's credential."""

    host: str
    port: int
    tls: ssl.SSLContext | None = None
    method: str = ""  # auth_method_name ("" : none)
    credential: bytes = field(default=b"", repr=False)
    timeout: float = 60.0

    def open(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        if self.tls is None:
            return sock
        try:
            return self.tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise

    def scrub(self, text: str) -> str:
        """``text`` without the credential (a broker's message is not trusted to leave it out)."""
        secret = self.credential.decode(errors="replace")
        parts = [secret]
        if self.method == "basic" and ":" in secret:  # user:password: the password alone too
            parts.append(secret.split(":", 1)[1])
        for part in parts:
            if part:
                text = text.replace(part, "***")
        return text


def address(service_url: str) -> tuple[str, int, bool]:
    """``(host, port, tls)`` of the first broker of a ``pulsar://`` or ``pulsar+ssl://`` URL."""
    scheme, sep, rest = service_url.strip().partition("://")
    if not sep or scheme not in DEFAULT_PORTS:
        raise InvalidConfiguration(f"service.url {service_url!r}: expected pulsar:// or pulsar+ssl://")
    rest = rest.rstrip("/").split(",", 1)[0]
    if rest.startswith("["):  # [ipv6]:port
        host, _, port = rest[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not host:
        raise InvalidConfiguration(f"service.url {service_url!r}: no host")
    if port and not port.isdigit():
        raise InvalidConfiguration(f"service.url {service_url!r}: the port is not a number")
    return host, int(port) if port else DEFAULT_PORTS[scheme], scheme == "pulsar+ssl"


def connection(service_url: str, client: Mapping[str, Any]) -> Connection:
    """The ``Connection`` of a read's ``service.url`` and ``pulsar.client.*`` options."""
    lowered = {str(k).lower(): v for k, v in client.items()}
    other = sorted(set(lowered) - KNOWN)
    if other:
        raise Unsupported(f"pulsar.client.{other[0]} is applied by the official client")
    host, port, tls = address(service_url)
    kind = _plugin_kind(str(lowered.get("authpluginclassname") or ""))
    plugin = lowered.get("authpluginclassname")
    params = str(lowered.get("authparams") or "")
    if params and not plugin:
        raise InvalidConfiguration("pulsar.client.authParams needs pulsar.client.authPluginClassName")
    if plugin and not kind:
        raise Unsupported("this authentication plugin is loaded by the official client")
    method, credential = "", b""
    if kind == "token":
        token = params.strip().removeprefix("token:").strip()
        if not token:
            raise InvalidConfiguration(
                "pulsar.client.authParams of token authentication is empty (set token:<the token>)"
            )
        method, credential = "token", token.encode()
    elif kind == "basic":
        user, password = _basic_credentials(params)
        method, credential = "basic", f"{user}:{password}".encode()
    elif kind == "tls":
        method = "tls"
        if not tls:
            raise InvalidConfiguration("TLS authentication needs a pulsar+ssl:// service.url")
    return Connection(
        host,
        port,
        tls_context(lowered) if tls else None,
        method,
        credential,
        timeout_seconds(lowered),
    )


def timeout_seconds(lowered: Mapping[str, Any]) -> float:
    """The socket timeout: the client's operation timeout when given, else 60 s."""
    try:
        if "operationtimeoutms" in lowered:
            return max(1.0, int(lowered["operationtimeoutms"]) / 1000)
        if "operationtimeoutseconds" in lowered:
            return max(1.0, float(int(lowered["operationtimeoutseconds"])))
    except (TypeError, ValueError):
        raise InvalidConfiguration("option pulsar.client.operationTimeoutMs is not a number") from None
    return 60.0


def user_file(option: str, value: Any) -> str:
    """A file path from an option, by the rule of this module's docstring: a plain path to a
    regular file (no URL), opened only as the PEM file the option names."""
    path = str(value).strip()
    if "://" in path or not path:
        raise InvalidConfiguration(f"option pulsar.client.{option} must be a file path (no URL)")
    if not os.path.isfile(path):
        raise InvalidConfiguration(
            f"option pulsar.client.{option}: no readable file at that path on the Spark executor"
        )
    return path


def tls_context(lowered: Mapping[str, Any]) -> ssl.SSLContext:
    """The TLS context of a ``pulsar+ssl://`` connection (see the module docstring for the options)."""
    trust = lowered.get("tlstrustcertsfilepath")
    insecure = _bool("tlsAllowInsecureConnection", lowered.get("tlsallowinsecureconnection", False))
    verify_names = all(
        _bool(name, lowered.get(name.lower(), True))
        for name in ("tlsValidateHostname", "tlsHostnameVerificationEnable")
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if trust:
            ctx.load_verify_locations(cafile=user_file("tlsTrustCertsFilePath", trust))
        else:
            ctx.load_default_certs()
    except ssl.SSLError:
        raise InvalidConfiguration(
            "option pulsar.client.tlsTrustCertsFilePath: the file holds no PEM certificate"
        ) from None
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif not verify_names:
        ctx.check_hostname = False
    cert, key = lowered.get("tlscertificatefilepath"), lowered.get("tlskeyfilepath")
    if _plugin_kind(str(lowered.get("authpluginclassname") or "")) == "tls":
        cert, key = _tls_files(str(lowered.get("authparams") or ""))
    if cert or key:
        if not (cert and key):
            raise InvalidConfiguration(
                "a client certificate needs both pulsar.client.tlsCertificateFilePath and tlsKeyFilePath"
            )
        try:
            ctx.load_cert_chain(user_file("tlsCertificateFilePath", cert), user_file("tlsKeyFilePath", key))
        except ssl.SSLError:
            raise InvalidConfiguration(
                "the client certificate or key file does not parse (PEM expected, the key unencrypted)"
            ) from None
    return ctx
