"""How the admin CLI proves who it is and trusts the broker: pulsar-admin's global options.

* ``--auth-plugin``: Pulsar's client plugin class names --
  ``org.apache.pulsar.client.impl.auth.AuthenticationToken``, ``...AuthenticationTls``,
  ``...AuthenticationBasic`` -- or the short names ``token``, ``tls``, ``basic``;
* ``--auth-params``, in the forms those plugins read:

  - token: ``token:<jwt>``, ``file:///path/to/token``, ``{"token": "<jwt>"}`` or the bare JWT
    (sent as ``Authorization: Bearer <jwt>``);
  - basic: ``{"userId": "u", "password": "p"}``, ``userId:u,password:p`` or ``u:p``
    (sent as ``Authorization: Basic ...``);
  - tls: ``tlsCertFile:/path/cert.pem,tlsKeyFile:/path/key.pem`` or the same as JSON (the client
    certificate presented in the TLS handshake; ``--tls-cert-file``/``--tls-key-file`` too);

* ``--tls-trust-cert-path`` (the CA that signed the broker's certificate), ``--tls-allow-insecure``
  (trust any certificate), ``--tls-enable-hostname-verification`` (off by default, as in Pulsar).

Secrets (tokens, passwords, key files' contents) are never printed: errors name the option or the
file, not what is in it.
"""

from __future__ import annotations

import base64
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..errors import InvalidInput

PLUGIN_PACKAGE = "org.apache.pulsar.client.impl.auth."
METHODS = {"token": "AuthenticationToken", "tls": "AuthenticationTls", "basic": "AuthenticationBasic"}
_BY_NAME = {
    **{m: m for m in METHODS},
    **{c: m for m, c in METHODS.items()},
    **{PLUGIN_PACKAGE + c: m for m, c in METHODS.items()},
}


@dataclass(frozen=True)
class ClientAuth:
    """What the CLI sends: an ``Authorization`` header and/or a client certificate."""

    method: str | None = None
    authorization: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __repr__(self) -> str:  # never show the header (it holds the secret)
        return f"ClientAuth(method={self.method!r}, cert_file={self.cert_file!r})"


def plugin_method(plugin: str) -> str:
    """``token``, ``tls`` or ``basic`` for a Pulsar plugin class name or short name."""
    method = _BY_NAME.get(plugin.strip()) or _BY_NAME.get(plugin.strip().lower())
    if method is None:
        names = ", ".join(PLUGIN_PACKAGE + c for c in METHODS.values())
        raise InvalidInput(f"unsupported --auth-plugin {plugin!r}: use {names} (or token, tls, basic)")
    return method


def client_auth(
    plugin: str | None, params: str | None, cert_file: str | None = None, key_file: str | None = None
) -> ClientAuth:
    """The credentials the global options describe (InvalidInput, naming the option, if wrong)."""
    if not plugin:
        if params:
            raise InvalidInput("--auth-params needs --auth-plugin (token, tls or basic)")
        return ClientAuth(None, None, cert_file, key_file)
    method = plugin_method(plugin)
    params = (params or "").strip()
    if method == "token":
        return ClientAuth(method, f"Bearer {_token(params)}", cert_file, key_file)
    if method == "basic":
        user, password = _basic(params)
        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        return ClientAuth(method, f"Basic {pair}", cert_file, key_file)
    values = _key_values(params) if params else {}
    cert = values.get("tlsCertFile") or cert_file
    key = values.get("tlsKeyFile") or key_file
    if not cert or not key:
        raise InvalidInput(
            "TLS authentication needs a client certificate and key: "
            "--auth-params tlsCertFile:/path/cert.pem,tlsKeyFile:/path/key.pem"
        )
    return ClientAuth(method, None, cert, key)


def _read_file_url(url: str, what: str) -> str:
    parsed = urlparse(url)
    path = unquote(parsed.path) if parsed.scheme == "file" else url
    if parsed.netloc and parsed.netloc != "localhost":  # file://relative/path, as Java would not read it
        path = parsed.netloc + path
    try:
        return Path(path).read_text().strip()
    except OSError as e:
        raise InvalidInput(f"cannot read the {what} file {path}: {e.strerror}") from None


def _token(params: str) -> str:
    if params.startswith("token:"):
        token = params[len("token:") :].strip()
    elif params.startswith("file:"):
        token = _read_file_url(params, "token")
    elif params.startswith("{"):
        values = _json_params(params)
        if values.get("token"):
            token = str(values["token"]).strip()
        elif values.get("file"):
            token = _read_file_url(str(values["file"]), "token")
        else:
            raise InvalidInput('token --auth-params as JSON needs "token" or "file"')
    else:
        token = params
    if not token:
        raise InvalidInput("token authentication needs a token: --auth-params token:<jwt> or file:///path")
    return token


def _basic(params: str) -> tuple[str, str]:
    if params.startswith("{"):
        values = _json_params(params)
    elif "userId:" in params and "password:" in params:
        values = _key_values(params)
    elif ":" in params:
        user_id, _, secret = params.partition(":")
        values = {"userId": user_id, "password": secret}
    else:
        values = {}
    user, password = values.get("userId"), values.get("password")
    if not user or password is None:
        raise InvalidInput(
            'basic authentication needs --auth-params \'{"userId":"USER","password":"PASSWORD"}\''
        )
    return str(user), str(password)


def _json_params(params: str) -> dict:
    try:
        values = json.loads(params)
    except ValueError:
        raise InvalidInput("--auth-params is not valid JSON") from None  # the text may hold a secret
    if not isinstance(values, dict):
        raise InvalidInput("--auth-params as JSON must be an object")
    return values


def _key_values(params: str) -> dict[str, str]:
    """Pulsar's ``key1:value1,key2:value2`` parameter string (or the same as a JSON object)."""
    if params.startswith("{"):
        return {k: str(v) for k, v in _json_params(params).items()}
    out = {}
    for part in params.split(","):
        key, sep, value = part.partition(":")
        if not sep:
            raise InvalidInput("--auth-params must be key:value pairs separated by commas")
        out[key.strip()] = value.strip()
    return out


def ssl_context(
    trust_cert_path: str | None, allow_insecure: bool, verify_hostname: bool, auth: ClientAuth
) -> ssl.SSLContext:
    """The client TLS context for an ``https://`` admin URL."""
    try:
        ctx = (
            ssl.create_default_context(cafile=trust_cert_path)
            if trust_cert_path
            else ssl.create_default_context()
        )
    except (OSError, ssl.SSLError) as e:
        raise InvalidInput(f"cannot load --tls-trust-cert-path {trust_cert_path}: {_ssl_reason(e)}") from None
    ctx.check_hostname = verify_hostname and not allow_insecure
    if allow_insecure:
        ctx.verify_mode = ssl.CERT_NONE
    if auth.cert_file:
        if not auth.key_file:
            raise InvalidInput(
                "a client certificate needs its key: --tls-key-file (or tlsKeyFile in --auth-params)"
            )
        try:
            ctx.load_cert_chain(auth.cert_file, auth.key_file)
        except (OSError, ssl.SSLError) as e:
            raise InvalidInput(
                f"cannot load the client certificate {auth.cert_file} and key {auth.key_file}: "
                f"{_ssl_reason(e)}"
            ) from None
    return ctx


def _ssl_reason(e: Exception) -> str:
    # an OSError has strerror, an ssl.SSLError reason, anything else its message
    return getattr(e, "strerror", None) or getattr(e, "reason", None) or str(e)
