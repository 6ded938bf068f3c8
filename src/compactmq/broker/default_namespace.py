"""The default tenant and namespace of a standalone broker, created when Pulsar's would be.

A Pulsar standalone, once its broker is up, creates the ``public`` tenant (admin roles: the
superusers; allowed clusters: its own) and the ``public/default`` namespace *through its own
admin client*, as any other client would: with the credentials of ``brokerClientAuthentication
Plugin``/``...Parameters``, or none. When the broker's security refuses that client (authentication
on and no usable credential; authorization on and the client's role not a superuser), the
creation fails, Pulsar logs it, and the broker runs without them. Operators then create them
over the admin API -- the Python client's CI does exactly that: ``PUT tenants/public`` with
``anonymous`` as admin, then ``PUT namespaces/public/default`` granting ``anonymous`` produce
and consume in the body. Had the broker created them anyway, those PUTs would answer 409 and
the grants would never be made.

compactmq follows the same rule without the HTTP round trip: ``admin_client_role`` decides
which role the broker's admin client would have (or why it has none), ``may_create`` applies
the authorization rule, and ``ensure_default_namespace`` creates what is missing when allowed.
It runs at every start, as Pulsar's does: a default namespace deleted by an operator comes back
at the next start of a broker whose own client may create it.

Credentials are read from the operator's configuration (never from a client): a token given
inline (``token:...``, a bare token, ``{"token": ...}``) or in a file (``file:///path``), a basic
``{"userId": ..., "password": ...}``, or a TLS certificate (``tlsCertFile:...``: its CN is the
role, as the TLS provider reads it). They go through the broker's own providers, so an invalid
token is refused here as it would be over the wire.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse

from ..auth import METHOD_BASIC, METHOD_TLS, METHOD_TOKEN, AuthenticationService
from ..config import config_list, setting
from ..errors import AlreadyExists, AuthenticationFailed
from ..naming import DEFAULT_NAMESPACE, DEFAULT_TENANT

log = logging.getLogger(__name__)

_CLIENT_AUTH = "org.apache.pulsar.client.impl.auth."
_PLUGIN_METHODS = {
    "AuthenticationToken": METHOD_TOKEN,
    "AuthenticationBasic": METHOD_BASIC,
    "AuthenticationTls": METHOD_TLS,
}


class NoRole(Exception):
    """The broker's admin client would not be authenticated; the message says why."""


def _plugin_method(plugin: str) -> str:
    short = plugin.removeprefix(_CLIENT_AUTH)
    if short not in _PLUGIN_METHODS:
        raise NoRole(f"brokerClientAuthenticationPlugin {plugin!r} is not one compactmq can use")
    return _PLUGIN_METHODS[short]


def _read_file_url(value: str) -> str:
    path = urlparse(value).path if value.startswith("file://") else value.removeprefix("file:")
    try:
        return Path(path).read_text().strip()
    except OSError as e:
        raise NoRole(f"brokerClientAuthenticationParameters: cannot read {path}: {e.strerror}") from None


def _params(text: str) -> dict[str, str]:
    """Pulsar's two parameter forms: a JSON object, or ``key:value,key:value``."""
    text = text.strip()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            raise NoRole("brokerClientAuthenticationParameters is not valid JSON") from None
        return {str(k): str(v) for k, v in parsed.items()} if isinstance(parsed, dict) else {}
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _token(text: str) -> str:
    text = text.strip()
    if text.startswith("{"):
        return _params(text).get("token", "")
    if text.startswith("token:"):
        return text.removeprefix("token:")
    if text.startswith("file:"):
        return _read_file_url(text)
    return text


def _credential(method: str, parameters: str) -> tuple[bytes, dict | None]:
    """CONNECT's ``auth_data`` (and a peer certificate for TLS) for the admin client's method."""
    if method == METHOD_TOKEN:
        return _token(parameters).encode(), None
    if method == METHOD_BASIC:
        params = _params(parameters)
        return f"{params.get('userId', '')}:{params.get('password', '')}".encode(), None
    cert_file = _params(parameters).get("tlsCertFile", "")
    return b"", _certificate_subject(cert_file)


def _certificate_subject(cert_file: str) -> dict:
    """The certificate's subject in ``getpeercert()`` form (what the TLS provider reads)."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    except (OSError, ValueError) as e:
        raise NoRole(f"brokerClientAuthenticationParameters: tlsCertFile {cert_file!r}: {e}") from None
    names = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return {"subject": tuple(((("commonName", str(n.value)),) for n in names))}


def admin_client_role(config: Mapping[str, Any], authentication: AuthenticationService) -> str | None:
    """The role the broker's own admin client has (None: authentication is off). ``NoRole`` when
    the broker would refuse it."""
    if not authentication.enabled:
        return None
    plugin = str(config["brokerClientAuthenticationPlugin"] or "").strip()
    try:
        if not plugin:  # no credentials: the anonymous role, when there is one
            return authentication.authenticate_connect("", b"", None).role
        method = _plugin_method(plugin)
        data, peer_cert = _credential(method, str(config["brokerClientAuthenticationParameters"] or ""))
        return authentication.authenticate_connect(method, data, peer_cert).role
    except AuthenticationFailed as e:
        raise NoRole(str(e)) from None


def may_create(config: Mapping[str, Any], authentication: AuthenticationService) -> tuple[bool, str]:
    """Whether the admin client may create the tenant and namespace (both need a superuser:
    the new tenant's admins are the superusers), and if not, why."""
    try:
        role = admin_client_role(config, authentication)
    except NoRole as e:
        return False, f"the broker's admin client is not authenticated: {e}"
    if config["authorizationEnabled"] and role not in config_list(config, "superUserRoles"):
        return False, f"the broker's admin client (role {role!r}) is not a superuser"
    return True, ""


def ensure_default_namespace(
    resources: Any, config: Mapping[str, Any], authentication: AuthenticationService
) -> bool:
    """Create the ``public`` tenant and ``public/default`` when missing and the broker's admin
    client may (one log line when it may not). Returns whether both exist afterwards."""
    namespace = f"{DEFAULT_TENANT}/{DEFAULT_NAMESPACE}"
    if resources.namespaces.exists(namespace):
        return True
    allowed, why = may_create(config, authentication)
    if not allowed:
        log.warning("%s not created: %s; create it over the admin API", namespace, why)
        return False
    if resources.tenants.get(DEFAULT_TENANT) is None:
        info = {
            "adminRoles": sorted(set(config_list(config, "superUserRoles"))),
            "allowedClusters": [str(setting(config, "clusterName"))],
        }
        try:
            resources.tenants.create(DEFAULT_TENANT, info)
        except AlreadyExists:
            pass
    try:
        resources.namespaces.create(namespace, {})
    except AlreadyExists:
        pass
    return True
